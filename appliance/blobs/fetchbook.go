package blobs

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// Bounds of the fetches a server follows (fetchBook).
const (
	// maxFetches is how many fetches in progress the server follows; a
	// report of one more is counted (OutcomeFull) and not shown.
	maxFetches = 64
	// endedFetches is how many ended fetches the status keeps showing.
	endedFetches = 8
	// fetchSilence is how long a fetch in progress may go without a
	// report before the server takes it as abandoned.
	fetchSilence = 30 * time.Second
	// maxReportError bounds a report's error text.
	maxReportError = 2048
)

// FetchStatus is a fetch as the node's status shows it: its last report,
// when the first and the last came.
type FetchStatus struct {
	FetchReport
	Started time.Time `json:"started"`
	Updated time.Time `json:"updated"`
}

// Elapsed is how long the fetch ran (or has run): by its own report, or,
// from a fetcher that does not say (an older meshbox), between the first
// and the last report the node heard; zero when the node heard one
// report only and cannot time it.
func (s FetchStatus) Elapsed() time.Duration {
	if s.Seconds > 0 {
		return time.Duration(s.Seconds * float64(time.Second))
	}
	return s.Updated.Sub(s.Started)
}

// FetchTotals are what the fetches of the node's clients did since the
// node started, from their reports.
type FetchTotals struct {
	Bytes    int64            // bytes that arrived
	Retries  Retries          // requests asked again, by cause
	Outcomes map[string]int64 // ended fetches: StateDone, a Cause*, or StateAbandoned
	Running  int              // fetches in progress
}

// FetchOutcomes are the outcomes an ended fetch is counted under.
var FetchOutcomes = []string{StateDone, CauseUnreachable, CauseNotFound, CauseCorrupt, CauseStalled, CauseCanceled, CauseError, StateAbandoned}

var fetchStates = []string{StateFetching, StateDone, StateFailed}

var fetchCauses = []string{CauseUnreachable, CauseNotFound, CauseCorrupt, CauseStalled, CauseCanceled, CauseError}

// fetchBook keeps the fetches the node's clients report: the ones in
// progress, the last ones that ended, and the totals. mu guards all of it;
// (badShown is atomic); its methods take the time, so that its rules are tested without a clock.
type fetchBook struct {
	mu       sync.Mutex
	live     map[string]*FetchStatus
	ended    []FetchStatus // the newest last
	totals   FetchTotals
	badShown atomic.Bool // a refused report was logged
	logger   *slog.Logger
}

func newFetchBook(logger *slog.Logger) *fetchBook {
	return &fetchBook{live: map[string]*FetchStatus{}, totals: FetchTotals{Outcomes: map[string]int64{}}, logger: logger}
}

// errFetchReport: a report breaks the rules of FetchReport.
var errFetchReport = errors.New("bad fetch report")

// checkReport checks a report against the rules of FetchReport.
func checkReport(r FetchReport) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errFetchReport, fmt.Sprintf(format, args...))
	}
	if id, err := hex.DecodeString(r.ID); err != nil || len(id) != 16 || hex.EncodeToString(id) != r.ID {
		return bad("id %q is not 32 lowercase hex digits", r.ID)
	}
	if _, err := ParseRef(r.Ref); err != nil {
		return bad("%v", err)
	}
	switch {
	case r.Size < 0 || r.Have < 0 || r.Have > r.Size:
		return bad("have %d of size %d", r.Have, r.Size)
	case r.Bytes < 0 || r.Window < 0 || r.Piece < 0 || r.Requests < 0:
		return bad("a negative count")
	case r.Retries.Deadline < 0 || r.Retries.Unavailable < 0 || r.Retries.Corrupt < 0:
		return bad("a negative retry count")
	case math.IsNaN(r.Rate) || math.IsInf(r.Rate, 0) || r.Rate < 0:
		return bad("rate %v", r.Rate)
	case math.IsNaN(r.Seconds) || math.IsInf(r.Seconds, 0) || r.Seconds < 0:
		return bad("seconds %v", r.Seconds)
	case !slices.Contains(fetchStates, r.State):
		return bad("state %q is not one of %v", r.State, fetchStates)
	case r.State == StateFailed && !slices.Contains(fetchCauses, r.Cause):
		return bad("cause %q is not one of %v", r.Cause, fetchCauses)
	case r.State != StateFailed && (r.Cause != "" || r.Error != ""):
		return bad("a cause or an error in state %s", r.State)
	case len(r.Error) > maxReportError:
		return bad("error text of %d bytes (at most %d)", len(r.Error), maxReportError)
	}
	return nil
}

// report takes a report that arrived at now and says how it was counted.
func (b *fetchBook) report(r FetchReport, now time.Time) (outcome string) {
	if err := checkReport(r); err != nil {
		b.refused(err)
		return OutcomeBadInput
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expire(now)
	st := b.live[r.ID]
	if st == nil {
		if slices.ContainsFunc(b.ended, func(e FetchStatus) bool { return e.ID == r.ID }) {
			return OutcomeOK // a report after the last: nothing new
		}
		if len(b.live) >= maxFetches {
			return OutcomeFull
		}
		st = &FetchStatus{Started: now, FetchReport: FetchReport{ID: r.ID}}
		b.live[r.ID] = st
	}
	if r.Ref != st.Ref && st.Ref != "" {
		b.refused(fmt.Errorf("%w: fetch %s reported %s, then %s", errFetchReport, r.ID, st.Ref, r.Ref))
		return OutcomeBadInput
	}
	// The totals grow by what grew: a client's counts only go up, and one
	// that says less than before adds nothing (and is kept at its most).
	grow(&b.totals.Bytes, &st.Bytes, r.Bytes)
	grow(&b.totals.Retries.Deadline, &st.Retries.Deadline, r.Retries.Deadline)
	grow(&b.totals.Retries.Unavailable, &st.Retries.Unavailable, r.Retries.Unavailable)
	grow(&b.totals.Retries.Corrupt, &st.Retries.Corrupt, r.Retries.Corrupt)
	r.Bytes, r.Retries = st.Bytes, st.Retries
	st.FetchReport, st.Updated = r, now
	if r.State != StateFetching {
		b.end(st, now)
	}
	return OutcomeOK
}

// grow adds to total what a count grew by since was, and keeps it in was.
func grow[T int | int64](total, was *T, now T) {
	if now > *was {
		*total += now - *was
		*was = now
	}
}

// end moves an ended fetch from live to ended, counts and logs it. mu is
// held.
func (b *fetchBook) end(st *FetchStatus, now time.Time) {
	delete(b.live, st.ID)
	outcome := st.State
	switch st.State {
	case StateFailed:
		outcome = st.Cause
	case StateFetching:
		outcome, st.State = StateAbandoned, StateAbandoned
	}
	b.totals.Outcomes[outcome]++
	b.ended = append(b.ended, *st)
	if len(b.ended) > endedFetches {
		b.ended = b.ended[len(b.ended)-endedFetches:]
	}
	secs := st.Elapsed().Seconds()
	switch outcome {
	case StateDone:
		b.logger.Info("blob fetched", "ref", st.Ref, "size", st.Size, "bytes", st.Bytes, "seconds", math.Round(secs*10)/10,
			"rate", math.Round(st.Rate), "requests", st.Requests, "retries_deadline", st.Retries.Deadline,
			"retries_unavailable", st.Retries.Unavailable, "retries_corrupt", st.Retries.Corrupt)
	case StateAbandoned:
		b.logger.Warn("blob fetch stopped reporting", "ref", st.Ref, "have", st.Have, "size", st.Size,
			"silent", now.Sub(st.Updated).Round(time.Second))
	default:
		b.logger.Warn("blob fetch failed", "ref", st.Ref, "cause", st.Cause, "have", st.Have, "size", st.Size, "err", st.Error)
	}
}

// expire ends the fetches that stopped reporting. mu is held.
func (b *fetchBook) expire(now time.Time) {
	for _, st := range b.live {
		if now.Sub(st.Updated) > fetchSilence {
			b.end(st, now)
		}
	}
}

// refused logs the first refused report (the metrics count them all).
func (b *fetchBook) refused(err error) {
	if !b.badShown.Swap(true) {
		b.logger.Warn("blob fetch report refused (logged once)", "err", err)
	}
}

// view returns the fetches in progress (the oldest first), then the
// ended ones (the newest last), and the totals.
func (b *fetchBook) view(now time.Time) ([]FetchStatus, FetchTotals) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expire(now)
	out := make([]FetchStatus, 0, len(b.live)+len(b.ended))
	for _, st := range b.live {
		out = append(out, *st)
	}
	slices.SortFunc(out, func(a, c FetchStatus) int { return a.Started.Compare(c.Started) })
	out = append(out, b.ended...)
	t := b.totals
	t.Outcomes = make(map[string]int64, len(b.totals.Outcomes))
	for k, n := range b.totals.Outcomes {
		t.Outcomes[k] = n
	}
	t.Running = len(b.live)
	return out, t
}

// onFetchReport takes a report on SubjectFetches.
func (s *Server) onFetchReport(m *nats.Msg) {
	var r FetchReport
	outcome := OutcomeBadInput
	if err := json.Unmarshal(m.Data, &r); err != nil {
		s.fetches.refused(fmt.Errorf("%w: %v", errFetchReport, err))
	} else {
		outcome = s.fetches.report(r, time.Now())
	}
	s.counts.add(KindFetchReport, outcome, 0)
}

// Fetches are the fetches the node's clients reported: in progress, then
// the last ones that ended; and what they did since the node started.
func (s *Server) Fetches() ([]FetchStatus, FetchTotals) { return s.fetches.view(time.Now()) }
