package blobs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"time"
)

// ReportInterval is how often a fetch reports its progress to the local
// node (SubjectFetches).
const ReportInterval = time.Second

// States of a fetch (FetchReport.State).
const (
	StateFetching = "fetching"
	StateDone     = "done"
	StateFailed   = "failed"
	// StateAbandoned is the node's word for a fetch that stopped reporting
	// before it ended (its process was killed, say).
	StateAbandoned = "abandoned"
)

// Causes of a failed fetch (FetchReport.Cause).
const (
	CauseUnreachable = "unreachable" // the owner is gone or not connected, or the mesh is unreachable
	CauseNotFound    = "not_found"   // the owner has no such blob
	CauseCorrupt     = "corrupt"     // what arrived does not match its hash, or a bad manifest
	CauseStalled     = "stalled"     // nothing arrived for the fetch's patience
	CauseCanceled    = "canceled"    // the fetch was stopped
	CauseError       = "error"       // anything else: the file, a refused request
)

// FetchReport is a fetch's progress as its Fetcher reports it to the
// local node on SubjectFetches: every ReportInterval, and once when it
// ends. The node takes it as its client's word: it shows it and counts
// it, and acts on nothing in it.
type FetchReport struct {
	ID       string  `json:"id"` // the fetch's own: 32 hex digits, random
	Ref      string  `json:"ref"`
	Size     int64   `json:"size"`     // the blob's (0 until the manifest arrived)
	Have     int64   `json:"have"`     // bytes the file holds
	Bytes    int64   `json:"bytes"`    // bytes that arrived across the mesh, the ones fetched again too
	Rate     float64 `json:"rate"`     // bytes per second, as measured now
	Window   int     `json:"window"`   // bytes it may have in flight now
	Piece    int     `json:"piece"`    // bytes it asks for at once now
	Requests int     `json:"requests"` // requests answered
	Retries  Retries `json:"retries"`
	State    string  `json:"state"`           // StateFetching, StateDone or StateFailed
	Cause    string  `json:"cause,omitempty"` // a failed fetch's: Cause*
	Error    string  `json:"error,omitempty"`
	// Seconds is how long the fetch has run, by its own clock: a fetch
	// that ends before the node heard from it is timed too.
	Seconds float64 `json:"seconds"`
}

// Retries counts what a fetch asked for again, by cause.
type Retries struct {
	Deadline    int `json:"deadline"`    // a request whose deadline passed
	Unavailable int `json:"unavailable"` // the owner or the mesh away for a moment (503)
	Corrupt     int `json:"corrupt"`     // a chunk that did not match its hash
}

// reporter sends one fetch's reports. Its fields are the fetch's loop's.
type reporter struct {
	f     *Fetcher
	ref   Ref
	fl    *flow
	res   *Result
	id    string
	have  int64
	start time.Time // when the fetch began
}

func (f *Fetcher) newReporter(ref Ref, fl *flow, res *Result) *reporter {
	var id [16]byte
	_, _ = rand.Read(id[:]) // never fails (crypto/rand)
	return &reporter{f: f, ref: ref, fl: fl, res: res, id: hex.EncodeToString(id[:]), start: time.Now()}
}

// send publishes the fetch's progress in state (err: why it failed).
func (rp *reporter) send(state string, err error) {
	if rp.f.NoReport || rp.f.Conn == nil {
		return
	}
	res := rp.res
	r := FetchReport{
		ID: rp.id, Ref: rp.ref.String(), Size: res.Size, Have: rp.have, Bytes: res.Bytes,
		Rate: rp.fl.rate(), Window: rp.fl.window(), Piece: rp.fl.piece(), Requests: res.Requests,
		Seconds: time.Since(rp.start).Seconds(),
		Retries: Retries{Deadline: res.TimedOut, Unavailable: res.Retries - res.TimedOut, Corrupt: res.Refetched},
		State:   state,
	}
	if err != nil {
		r.Cause, r.Error = causeOf(err), err.Error()
	}
	// Numbers and strings: Marshal cannot fail. A report lost costs only
	// the status's view of the fetch.
	data, _ := json.Marshal(r)
	_ = rp.f.Conn.Publish(SubjectFetches, data)
}

// end sends the last report of the fetch, which ended with err (nil:
// done), and waits a moment for it to leave.
func (rp *reporter) end(err error) {
	if err != nil {
		rp.send(StateFailed, err)
	} else {
		rp.have = rp.res.Size
		rp.send(StateDone, nil)
	}
	if !rp.f.NoReport && rp.f.Conn != nil {
		_ = rp.f.Conn.FlushTimeout(time.Second)
	}
}

// causeOf is the cause of a fetch's failure.
func causeOf(err error) string {
	switch {
	case errors.Is(err, ErrUnreachable):
		return CauseUnreachable
	case errors.Is(err, ErrNotFound):
		return CauseNotFound
	case errors.Is(err, ErrCorrupt), errors.Is(err, ErrBadManifest):
		return CauseCorrupt
	case errors.Is(err, ErrStalled):
		return CauseStalled
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return CauseCanceled
	}
	return CauseError
}
