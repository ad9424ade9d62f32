package ledger

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
)

// Submit sends a command or event submission (subject cmd.<stage> or
// evt.<topic>) and reports what the submitter was told.
func Submit(nc *nats.Conn, subject string, body []byte, timeout time.Duration) (Outcome, *nats.Msg, error) {
	return SubmitMsg(nc, &nats.Msg{Subject: subject, Data: body}, timeout)
}

// SubmitMsg is Submit of a message with headers. A reply that is neither
// an error nor says how the node accepted the submission
// (Meshbox-Accepted) is no answer: Indeterminate, with an error.
func SubmitMsg(nc *nats.Conn, msg *nats.Msg, timeout time.Duration) (Outcome, *nats.Msg, error) {
	resp, err := nc.RequestMsg(msg, timeout)
	switch {
	case err != nil:
		return Indeterminate, nil, err
	case resp.Header.Get("Nats-Service-Error") != "" || resp.Header.Get("Nats-Service-Error-Code") != "":
		return Refused, resp, nil
	case resp.Header.Get("Meshbox-Accepted") == "":
		return Indeterminate, resp, fmt.Errorf("submission reply without Meshbox-Accepted header")
	default:
		return Acked, resp, nil
	}
}

// Load submits sequence-numbered submissions, Payload(Origin, seq) to
// Subject on NC, at a steady rate until told to stop, records what each
// submitter was told in History, and tallies the answers (Summary). Set
// its exported fields, then call Run once.
type Load struct {
	NC      *nats.Conn
	Subject string
	Origin  string
	History *History

	// Gate, when set, holds the workers while it is held (Gate.Hold).
	Gate *Gate

	next     atomic.Int64
	mu       sync.Mutex
	accepted Tally // Meshbox-Accepted -> count
	refusals Tally // "code text" -> count
	errs     Tally // client errors (no answer) -> count
}

// Run submits with workers goroutines at about rate per second until stop
// is closed and at least min were submitted (never more than max). It
// returns when every worker is done.
func (l *Load) Run(workers int, rate float64, min, max int, stop <-chan struct{}) {
	l.mu.Lock()
	l.accepted, l.refusals, l.errs = Tally{}, Tally{}, Tally{}
	l.mu.Unlock()
	pause := time.Duration(float64(workers) / rate * float64(time.Second))
	var wg sync.WaitGroup
	for range workers {
		// Submitter: exits when the run is complete (see above).
		wg.Go(func() {
			for {
				seq := int(l.next.Add(1)) - 1
				stopped := false
				select {
				case <-stop:
					stopped = true
				default:
				}
				if seq >= max || seq >= min && stopped {
					return
				}
				if !stopped {
					l.Gate.Wait(stop)
				}
				start := time.Now()
				o, resp, err := Submit(l.NC, l.Subject, Payload(l.Origin, seq), 20*time.Second)
				l.History.Submitted(Op{l.Origin, seq}, o)
				l.mu.Lock()
				switch o {
				case Acked:
					l.accepted[resp.Header.Get("Meshbox-Accepted")]++
				case Refused:
					code, text := natstest.ServiceError(resp)
					l.refusals[fmt.Sprintf("%d %s", code, Clip(text))]++
				case Indeterminate:
					l.errs[Clip(err.Error())]++
				}
				l.mu.Unlock()
				if d := pause - time.Since(start); d > 0 {
					time.Sleep(d)
				}
			}
		})
	}
	wg.Wait()
}

// Gate holds submitters between their submissions: a fault test holds
// its load while a broker boots, so that what a fault puts in the outbox
// does not grow with how long the machine takes to start one. The zero
// Gate is open.
type Gate struct {
	mu   sync.Mutex
	held chan struct{} // non-nil: held, closed by Release
}

// Hold makes Wait block until Release.
func (g *Gate) Hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held == nil {
		g.held = make(chan struct{})
	}
}

// Release lets the waiting submitters go on.
func (g *Gate) Release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held != nil {
		close(g.held)
		g.held = nil
	}
}

// Wait returns once g is not held, or stop is closed; a nil Gate never
// holds.
func (g *Gate) Wait(stop <-chan struct{}) {
	if g == nil {
		return
	}
	g.mu.Lock()
	held := g.held
	g.mu.Unlock()
	if held == nil {
		return
	}
	select {
	case <-held:
	case <-stop:
	}
}

// Started returns how many submissions the workers have begun (or were
// about to begin when the run ended).
func (l *Load) Started() int64 { return l.next.Load() }

// Answers returns copies of the tallies of the answers: how submissions
// were accepted (Meshbox-Accepted), the refusals ("code text") and the
// errors of the submissions without an answer.
func (l *Load) Answers() (accepted, refused, noAnswer Tally) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.accepted), maps.Clone(l.refusals), maps.Clone(l.errs)
}

// Summary describes the answers the submitters got.
func (l *Load) Summary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprintf("%s: accepted %s; refused %s; no answer %s", l.Subject, l.accepted, l.refusals, l.errs)
}

// Tally counts answers by what they said.
type Tally map[string]int

// String renders the tally, largest first ("none" when empty).
func (t Tally) String() string {
	if len(t) == 0 {
		return "none"
	}
	keys := slices.SortedFunc(maps.Keys(t), func(a, b string) int { return cmp.Or(cmp.Compare(t[b], t[a]), cmp.Compare(a, b)) })
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d× %q", t[k], k))
	}
	return strings.Join(parts, ", ")
}

// Clip shortens an answer for a Tally; digits are blanked so that similar
// answers count together.
func Clip(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= '0' && r <= '9' {
			r = '#'
		}
		b.WriteRune(r)
		if b.Len() > 120 {
			break
		}
	}
	return b.String()
}
