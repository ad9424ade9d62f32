package blobs

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"
)

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// goodReport is a valid report of a fetch in progress.
func goodReport(id string) FetchReport {
	return FetchReport{ID: id, Ref: Ref{"attic", sha256Hex("x")}.String(), Size: 1000, Have: 400, Bytes: 400,
		Rate: 12_500, Window: 32 << 10, Piece: 16 << 10, Requests: 3, State: StateFetching}
}

func TestCheckReport(t *testing.T) {
	id := strings.Repeat("ab", 16)
	tests := []struct {
		name   string
		change func(*FetchReport)
		bad    string // "" : valid
	}{
		{"in progress", func(*FetchReport) {}, ""},
		{"done", func(r *FetchReport) { r.State, r.Have = StateDone, r.Size }, ""},
		{"failed", func(r *FetchReport) { r.State, r.Cause, r.Error = StateFailed, CauseStalled, "nothing arrived" }, ""},
		{"before the manifest", func(r *FetchReport) { r.Size, r.Have, r.Bytes = 0, 0, 0 }, ""},
		{"short id", func(r *FetchReport) { r.ID = "ab" }, "id"},
		{"uppercase id", func(r *FetchReport) { r.ID = strings.ToUpper(id) }, "id"},
		{"bad ref", func(r *FetchReport) { r.Ref = "blob:attic/xyz" }, "reference"},
		{"have beyond size", func(r *FetchReport) { r.Have = 1001 }, "have"},
		{"negative bytes", func(r *FetchReport) { r.Bytes = -1 }, "negative"},
		{"negative retries", func(r *FetchReport) { r.Retries.Deadline = -2 }, "retry"},
		{"NaN rate", func(r *FetchReport) { r.Rate = math.NaN() }, "rate"},
		{"negative seconds", func(r *FetchReport) { r.Seconds = -1 }, "seconds"},
		{"infinite seconds", func(r *FetchReport) { r.Seconds = math.Inf(1) }, "seconds"},
		{"unknown state", func(r *FetchReport) { r.State = "paused" }, "state"},
		{"failed without a cause", func(r *FetchReport) { r.State = StateFailed }, "cause"},
		{"failed with an unknown cause", func(r *FetchReport) { r.State, r.Cause = StateFailed, "gremlins" }, "cause"},
		{"an error while fetching", func(r *FetchReport) { r.Error = "oops" }, "error"},
		{"a long error", func(r *FetchReport) {
			r.State, r.Cause, r.Error = StateFailed, CauseError, strings.Repeat("x", maxReportError+1)
		}, "error text"},
	}
	for _, tt := range tests {
		r := goodReport(id)
		tt.change(&r)
		err := checkReport(r)
		switch {
		case tt.bad == "" && err != nil:
			t.Errorf("%s: got %v, want valid", tt.name, err)
		case tt.bad != "" && (!errors.Is(err, errFetchReport) || !strings.Contains(err.Error(), tt.bad)):
			t.Errorf("%s: got %v, want a bad report naming %q", tt.name, err, tt.bad)
		}
	}
}

// TestFetchBook: the book shows the fetches in progress and the last ones
// that ended; its totals grow by what the reports' counts grew; a fetch
// that stops reporting is abandoned; past maxFetches a new one is not
// followed; a fetch's reference does not change.
func TestFetchBook(t *testing.T) {
	b := newFetchBook(slog.New(slog.DiscardHandler))
	id := func(i int) string { return strings.Repeat("0", 28) + hex.EncodeToString([]byte{byte(i >> 8), byte(i)}) }
	now := t0

	r := goodReport(id(1))
	if got := b.report(r, now); got != OutcomeOK {
		t.Fatalf("first report: got %s", got)
	}
	r.Bytes, r.Retries.Deadline = 700, 2
	b.report(r, now.Add(time.Second))
	r.Bytes, r.Retries.Deadline = 650, 1 // less than before: adds nothing
	b.report(r, now.Add(2*time.Second))
	fs, tot := b.view(now.Add(2 * time.Second))
	if len(fs) != 1 || fs[0].Started != now || fs[0].Updated != now.Add(2*time.Second) || tot.Running != 1 {
		t.Fatalf("after three reports: got %+v, totals %+v", fs, tot)
	}
	if tot.Bytes != 700 || tot.Retries.Deadline != 2 {
		t.Errorf("totals: got %d bytes, %d deadline retries, want 700 and 2", tot.Bytes, tot.Retries.Deadline)
	}
	r.State, r.Have, r.Bytes = StateDone, r.Size, 1100
	b.report(r, now.Add(3*time.Second))
	if got := b.report(r, now.Add(4*time.Second)); got != OutcomeOK { // again: nothing new
		t.Errorf("a report after the last: got %s, want ok", got)
	}
	fs, tot = b.view(now.Add(4 * time.Second))
	if len(fs) != 1 || fs[0].State != StateDone || tot.Outcomes[StateDone] != 1 || tot.Bytes != 1100 || tot.Running != 0 {
		t.Errorf("after the last report: got %+v, totals %+v", fs, tot)
	}

	// Another ref under the same id is refused.
	r2 := goodReport(id(2))
	b.report(r2, now)
	r2.Ref = Ref{"attic", sha256Hex("y")}.String()
	if got := b.report(r2, now); got != OutcomeBadInput {
		t.Errorf("a report naming another blob: got %s, want bad_input", got)
	}

	// Silent too long: abandoned.
	fs, tot = b.view(now.Add(fetchSilence + time.Second))
	if tot.Outcomes[StateAbandoned] != 1 || tot.Running != 0 || fs[len(fs)-1].State != StateAbandoned {
		t.Errorf("a fetch silent for %s: got %+v, totals %+v, want it abandoned", fetchSilence, fs, tot)
	}

	// No more than maxFetches followed; the ended ones shown are the last few.
	later := now.Add(time.Hour)
	for i := range maxFetches {
		if got := b.report(goodReport(id(100+i)), later); got != OutcomeOK {
			t.Fatalf("fetch %d: got %s", i, got)
		}
	}
	if got := b.report(goodReport(id(999)), later); got != OutcomeFull {
		t.Errorf("fetch %d: got %s, want full", maxFetches+1, got)
	}
	for i := range maxFetches {
		r := goodReport(id(100 + i))
		r.State, r.Cause, r.Error = StateFailed, CauseUnreachable, "node attic is gone"
		b.report(r, later)
	}
	fs, tot = b.view(later)
	if len(fs) != endedFetches || tot.Outcomes[CauseUnreachable] != maxFetches {
		t.Errorf("after %d failures: got %d shown, totals %+v; want %d shown", maxFetches, len(fs), tot, endedFetches)
	}
	if got := b.report(goodReport("nope"), later); got != OutcomeBadInput {
		t.Errorf("a bad report: got %s, want bad_input", got)
	}
}
