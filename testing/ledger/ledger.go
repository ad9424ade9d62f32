// Package ledger is the fault tests' checker. It judges a run the way a
// Jepsen checker does: from what the submitters were told (acknowledged,
// refused, or no answer) and what the handlers and subscribers saw, it
// reports what was lost, duplicated or unexpected.
//
// A submission is named by its origin and a sequence number, and its body
// says so ([Payload]), so that every delivery names the submission it
// belongs to. A [History] records both sides of a run, from any number of
// goroutines; [History.Check] judges it. [Load] submits a steady stream
// and records what each submitter was told; [Submit] is one submission.
//
// The rules a meshbox node keeps, and [Result.Valid] checks: every
// submission it acknowledged is delivered; a delivery after the first is
// marked Meshbox-Redelivered and keeps the first one's Meshbox-Msg-Id; a
// refused submission, or a body no submitter sent, is never delivered.
package ledger

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// Outcome is what a submitter was told about one submission.
type Outcome int

const (
	// Acked: the node acknowledged it (durable); it must be delivered.
	Acked Outcome = iota
	// Refused: the node answered with an error; it must never be
	// delivered.
	Refused
	// Indeterminate: no answer (timeout, connection lost); it may or may
	// not be delivered.
	Indeterminate
)

func (o Outcome) String() string {
	switch o {
	case Acked:
		return "acked"
	case Refused:
		return "refused"
	case Indeterminate:
		return "indeterminate"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// Op names one submission: the origin (a node, or a kind of traffic) and
// its sequence number there.
type Op struct {
	Origin string
	Seq    int
}

func (k Op) String() string { return fmt.Sprintf("%s:%d", k.Origin, k.Seq) }

// Payload is the body of submission seq of origin: "<origin>:<seq>".
func Payload(origin string, seq int) []byte {
	return []byte(origin + ":" + strconv.Itoa(seq))
}

// PaddedPayload is Payload followed by '|' and filler up to size bytes.
func PaddedPayload(origin string, seq, size int) []byte {
	b := append(Payload(origin, seq), '|')
	for len(b) < size {
		b = append(b, 'x')
	}
	return b
}

// ParsePayload reads a body made by Payload or PaddedPayload.
func ParsePayload(b []byte) (Op, bool) {
	s := string(b)
	if i := strings.IndexByte(s, '|'); i >= 0 {
		s = s[:i]
	}
	origin, s, ok := strings.Cut(s, ":")
	if !ok || origin == "" {
		return Op{}, false
	}
	seq, err := strconv.Atoi(s)
	if err != nil || seq < 0 {
		return Op{}, false
	}
	return Op{origin, seq}, true
}

// Delivery is one message a local program (handler or subscriber) saw.
type Delivery struct {
	Op     Op
	Bad    bool   // the body was not a payload
	Node   string // the node whose local program saw it
	MsgID  string // Meshbox-Msg-Id ("" for a node's own local events)
	Marked bool   // Meshbox-Redelivered: true
}

// DeliveryOf is the delivery of m as seen on node.
func DeliveryOf(node string, m *nats.Msg) Delivery {
	k, ok := ParsePayload(m.Data)
	return Delivery{
		Op: k, Bad: !ok, Node: node,
		MsgID:  m.Header.Get("Meshbox-Msg-Id"),
		Marked: m.Header.Get("Meshbox-Redelivered") == "true",
	}
}

func (d Delivery) String() string {
	if d.Bad {
		return "{bad payload on " + d.Node + "}"
	}
	return fmt.Sprintf("{%s on %s id %s marked %t}", d.Op, d.Node, d.MsgID, d.Marked)
}

// History collects the submissions and deliveries of a run. It is safe
// for concurrent use; its zero value is not: use NewHistory.
type History struct {
	mu         sync.Mutex
	ops        map[Op]Outcome
	deliveries []Delivery
}

// NewHistory returns an empty history.
func NewHistory() *History { return &History{ops: map[Op]Outcome{}} }

// Submitted records what the submitter of k was told.
func (h *History) Submitted(k Op, o Outcome) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops[k] = o
}

// Delivered records a delivery.
func (h *History) Delivered(d Delivery) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.deliveries = append(h.deliveries, d)
}

// Count returns how many deliveries were recorded.
func (h *History) Count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.deliveries)
}

// snapshot returns copies of the submissions and deliveries so far.
func (h *History) snapshot() (map[Op]Outcome, []Delivery) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.ops), slices.Clone(h.deliveries)
}

// Check judges the deliveries so far where each submission must arrive
// exactly once across every node (commands: once across all hosting
// nodes).
func (h *History) Check() Result {
	ops, ds := h.snapshot()
	return Check(ops, ds)
}

// CheckAt is Check restricted to the deliveries seen on node (events:
// every subscribed node gets each one once).
func (h *History) CheckAt(node string) Result {
	ops, ds := h.snapshot()
	var mine []Delivery
	for _, d := range ds {
		if d.Node == node {
			mine = append(mine, d)
		}
	}
	return Check(ops, mine)
}
