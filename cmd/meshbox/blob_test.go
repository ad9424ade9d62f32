package main

import (
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance/blobs"
)

func TestRateText(t *testing.T) {
	for _, tt := range []struct {
		perSec float64
		want   string
	}{
		{0, "0 B/s"},
		{900, "900 B/s"},
		{125_000, "122.1 KiB/s"},
		{40 << 20, "40.0 MiB/s"},
	} {
		if got := rateText(tt.perSec); got != tt.want {
			t.Errorf("rateText(%v): got %q, want %q", tt.perSec, got, tt.want)
		}
	}
}

// TestRateMeter: the progress bar's rate is over the last seconds, not
// since the start.
func TestRateMeter(t *testing.T) {
	var m rateMeter
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	if got := m.add(t0, 0); got != 0 {
		t.Errorf("one point: got %v, want 0", got)
	}
	for i := 1; i <= 10; i++ { // 100 kB/s for 10 s
		m.add(t0.Add(time.Duration(i)*time.Second), int64(i)*100_000)
	}
	got := m.add(t0.Add(11*time.Second), 1_000_000+10_000) // then 10 kB/s
	if got < 10_000 || got > 90_000 {
		t.Errorf("rate after a slowdown: got %.0f B/s, want between the new 10000 and the old 100000", got)
	}
}

func TestFetchLine(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ref := "blob:attic/" + strings.Repeat("5f", 32)
	for _, tt := range []struct {
		f    blobs.FetchStatus
		want []string
	}{
		{blobs.FetchStatus{FetchReport: blobs.FetchReport{Ref: ref, State: blobs.StateFetching, Size: 5 << 20, Have: 5 << 18,
			Rate: 125_000, Window: 96 << 10}, Started: t0, Updated: t0.Add(10 * time.Second)},
			[]string{ref + " fetching: 1.2 of 5.0 MiB (25%), 122.1 KiB/s, 96 KiB in flight"}},
		{blobs.FetchStatus{FetchReport: blobs.FetchReport{Ref: ref, State: blobs.StateDone, Size: 1 << 20, Have: 1 << 20, Bytes: 1 << 20,
			Retries: blobs.Retries{Deadline: 2}}, Started: t0, Updated: t0.Add(8 * time.Second)},
			[]string{"done: 1.0 MiB in 8.0 s (128.0 KiB/s)", "tried again: 2 after their deadline"}},
		// The node heard only the last report: the fetcher's own time,
		// not the node's zero, gives the rate.
		{blobs.FetchStatus{FetchReport: blobs.FetchReport{Ref: ref, State: blobs.StateDone, Size: 20 << 20, Have: 20 << 20, Bytes: 20 << 20,
			Seconds: 0.8}, Started: t0, Updated: t0},
			[]string{"done: 20.0 MiB in 0.8 s (25.0 MiB/s)"}},
		{blobs.FetchStatus{FetchReport: blobs.FetchReport{Ref: ref, State: blobs.StateDone, Size: 1 << 20, Have: 1 << 20, Bytes: 1 << 20,
			Seconds: 0.004}, Started: t0, Updated: t0},
			[]string{"done: 1.0 MiB in 0.004 s (250.0 MiB/s)"}},
		{blobs.FetchStatus{FetchReport: blobs.FetchReport{Ref: ref, State: blobs.StateFailed, Size: 1 << 20, Have: 1 << 19,
			Cause: blobs.CauseStalled, Error: "nothing arrived for 2m0s"}, Started: t0, Updated: t0},
			[]string{"failed at 0.5 of 1.0 MiB (stalled)", "— nothing arrived for 2m0s"}},
	} {
		got := fetchLine(tt.f)
		for _, w := range tt.want {
			if !strings.Contains(got, w) {
				t.Errorf("fetchLine: got %q, want it to contain %q", got, w)
			}
		}
	}
	// A fetcher that does not time itself, heard once: no time, and no
	// rate divided by a zero.
	untimed := blobs.FetchStatus{FetchReport: blobs.FetchReport{Ref: ref, State: blobs.StateDone, Size: 20 << 20, Have: 20 << 20, Bytes: 20 << 20},
		Started: t0, Updated: t0}
	if got := fetchLine(untimed); !strings.HasSuffix(got, "done: 20.0 MiB") {
		t.Errorf("fetchLine of an untimed fetch: got %q, want it to end with the size, without a time or a rate", got)
	}
}
