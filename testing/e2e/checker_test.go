package e2e

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
)

// The checker judges a run the way a Jepsen checker does: from what the
// submitters were told (acknowledged, refused, or no answer) and what the
// handlers and subscribers saw, it reports what was lost, duplicated or
// unexpected. Payloads carry "<origin>:<seq>", so every delivery names the
// submission it belongs to.

// outcome is what a submitter was told about one submission.
type outcome int

const (
	// acked: the node acknowledged it (durable); it must be delivered.
	acked outcome = iota
	// refused: the node answered with an error; it must never be delivered.
	refused
	// indeterminate: no answer (timeout, connection lost); it may or may
	// not be delivered.
	indeterminate
)

// opKey names one submission.
type opKey struct {
	origin string
	seq    int
}

func (k opKey) String() string { return fmt.Sprintf("%s:%d", k.origin, k.seq) }

// payload is the body of submission seq of origin.
func payload(origin string, seq int) []byte {
	return []byte(origin + ":" + strconv.Itoa(seq))
}

// paddedPayload is payload followed by '|' and filler up to size bytes.
func paddedPayload(origin string, seq, size int) []byte {
	b := append(payload(origin, seq), '|')
	for len(b) < size {
		b = append(b, 'x')
	}
	return b
}

// parsePayload reads a body made by payload or paddedPayload.
func parsePayload(b []byte) (opKey, bool) {
	s := string(b)
	if i := strings.IndexByte(s, '|'); i >= 0 {
		s = s[:i]
	}
	origin, s, ok := strings.Cut(s, ":")
	if !ok || origin == "" {
		return opKey{}, false
	}
	seq, err := strconv.Atoi(s)
	if err != nil || seq < 0 {
		return opKey{}, false
	}
	return opKey{origin, seq}, true
}

// delivery is one message a local program (handler or subscriber) saw.
type delivery struct {
	op     opKey
	bad    bool   // the body was not a payload
	node   string // the node whose local program saw it
	msgID  string // Meshbox-Msg-Id ("" for a node's own local events)
	marked bool   // Meshbox-Redelivered: true
}

// deliveryOf builds the delivery record of m as seen on node.
func deliveryOf(node string, m *nats.Msg) delivery {
	k, ok := parsePayload(m.Data)
	return delivery{
		op: k, bad: !ok, node: node,
		msgID:  m.Header.Get("Meshbox-Msg-Id"),
		marked: m.Header.Get("Meshbox-Redelivered") == "true",
	}
}

// history collects the submissions and deliveries of a run. It is safe for
// concurrent use.
type history struct {
	mu         sync.Mutex
	ops        map[opKey]outcome
	deliveries []delivery
}

func newHistory() *history { return &history{ops: map[opKey]outcome{}} }

// submitted records what the submitter of k was told.
func (h *history) submitted(k opKey, o outcome) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops[k] = o
}

// delivered records a delivery.
func (h *history) delivered(d delivery) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.deliveries = append(h.deliveries, d)
}

// count returns how many deliveries were recorded.
func (h *history) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.deliveries)
}

// snapshot returns copies of the submissions and deliveries so far.
func (h *history) snapshot() (map[opKey]outcome, []delivery) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ops := make(map[opKey]outcome, len(h.ops))
	for k, v := range h.ops {
		ops[k] = v
	}
	return ops, slices.Clone(h.deliveries)
}

// check judges deliveries against ops where each submission must arrive
// exactly once in the stream given (commands: across all hosting nodes;
// events: call it once per receiving node with that node's deliveries).
func (h *history) check() checkResult {
	ops, ds := h.snapshot()
	return check(ops, ds)
}

// checkAt is check restricted to the deliveries seen on node.
func (h *history) checkAt(node string) checkResult {
	ops, ds := h.snapshot()
	var mine []delivery
	for _, d := range ds {
		if d.node == node {
			mine = append(mine, d)
		}
	}
	return check(ops, mine)
}

// checkResult is the verdict on one stream of deliveries.
type checkResult struct {
	acked, refused, indeterminate int
	deliveries                    int

	lost        []opKey    // acked, never delivered
	dupMarked   int        // deliveries after the first, marked as redeliveries
	dupUnmarked []delivery // deliveries after the first without the mark
	idChanged   []delivery // later deliveries whose message id differs from the first's
	unexpected  []delivery // refused or never submitted, or not a payload
	// indeterminateDelivered counts submissions without an answer that
	// arrived (allowed either way).
	indeterminateDelivered int
	// inversions counts, per "node<-origin", first deliveries that arrived
	// after a first delivery with a higher sequence number.
	inversions map[string]int
}

// check is the checker proper.
func check(ops map[opKey]outcome, ds []delivery) checkResult {
	r := checkResult{deliveries: len(ds), inversions: map[string]int{}}
	for _, o := range ops {
		switch o {
		case acked:
			r.acked++
		case refused:
			r.refused++
		case indeterminate:
			r.indeterminate++
		}
	}
	first := map[opKey]delivery{}
	highest := map[string]int{} // node<-origin: highest seq delivered first so far
	for _, d := range ds {
		if d.bad {
			r.unexpected = append(r.unexpected, d)
			continue
		}
		o, known := ops[d.op]
		if !known || o == refused {
			r.unexpected = append(r.unexpected, d)
			continue
		}
		if f, seen := first[d.op]; seen {
			if d.marked {
				r.dupMarked++
			} else {
				r.dupUnmarked = append(r.dupUnmarked, d)
			}
			if d.msgID != f.msgID {
				r.idChanged = append(r.idChanged, d)
			}
			continue
		}
		first[d.op] = d
		if o == indeterminate {
			r.indeterminateDelivered++
		}
		stream := d.node + "<-" + d.op.origin
		if hi, ok := highest[stream]; ok && d.op.seq < hi {
			r.inversions[stream]++
		} else {
			highest[stream] = d.op.seq
		}
		if _, ok := r.inversions[stream]; !ok {
			r.inversions[stream] = 0
		}
	}
	for k, o := range ops {
		if _, ok := first[k]; o == acked && !ok {
			r.lost = append(r.lost, k)
		}
	}
	sort.Slice(r.lost, func(i, j int) bool {
		if r.lost[i].origin != r.lost[j].origin {
			return r.lost[i].origin < r.lost[j].origin
		}
		return r.lost[i].seq < r.lost[j].seq
	})
	return r
}

// valid reports whether nothing acknowledged was lost, every duplicate was
// marked and kept its message id, and nothing arrived that should not have.
func (r checkResult) valid() bool {
	return len(r.lost) == 0 && len(r.dupUnmarked) == 0 && len(r.idChanged) == 0 && len(r.unexpected) == 0
}

// totalInversions sums the order inversions of every stream.
func (r checkResult) totalInversions() int {
	n := 0
	for _, v := range r.inversions {
		n += v
	}
	return n
}

// String is the checker's report, one line per finding, with examples.
func (r checkResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "submitted: %d acked, %d refused, %d indeterminate (%d of them delivered); %d deliveries\n",
		r.acked, r.refused, r.indeterminate, r.indeterminateDelivered, r.deliveries)
	fmt.Fprintf(&b, "lost: %d%s\n", len(r.lost), examples(r.lost))
	fmt.Fprintf(&b, "duplicated: %d (%d marked redeliveries, %d unmarked%s)\n",
		r.dupMarked+len(r.dupUnmarked), r.dupMarked, len(r.dupUnmarked), examples(r.dupUnmarked))
	fmt.Fprintf(&b, "message id changed on redelivery: %d%s\n", len(r.idChanged), examples(r.idChanged))
	fmt.Fprintf(&b, "unexpected: %d%s\n", len(r.unexpected), examples(r.unexpected))
	streams := make([]string, 0, len(r.inversions))
	for s := range r.inversions {
		streams = append(streams, s)
	}
	sort.Strings(streams)
	fmt.Fprintf(&b, "order inversions:")
	for _, s := range streams {
		fmt.Fprintf(&b, " %s=%d", s, r.inversions[s])
	}
	if len(streams) == 0 {
		b.WriteString(" none delivered")
	}
	if r.valid() {
		b.WriteString("\nverdict: valid")
	} else {
		b.WriteString("\nverdict: INVALID")
	}
	return b.String()
}

// examples renders up to five items of a finding.
func examples[T any](items []T) string {
	if len(items) == 0 {
		return ""
	}
	var parts []string
	for i, it := range items {
		if i == 5 {
			parts = append(parts, "...")
			break
		}
		parts = append(parts, fmt.Sprint(it))
	}
	return ", e.g. " + strings.Join(parts, " ")
}

func (d delivery) String() string {
	if d.bad {
		return "{bad payload on " + d.node + "}"
	}
	return fmt.Sprintf("{%s on %s id %s marked %t}", d.op, d.node, d.msgID, d.marked)
}

func TestChecker(t *testing.T) {
	a := func(seq int) opKey { return opKey{"alpha", seq} }
	d := func(seq int, marked bool) delivery {
		return delivery{op: a(seq), node: "beta", msgID: "id" + strconv.Itoa(seq), marked: marked}
	}
	tests := []struct {
		name       string
		ops        map[opKey]outcome
		ds         []delivery
		valid      bool
		lost       int
		dupMarked  int
		dupUnmark  int
		unexpected int
		idChanged  int
		inversions int
		indetDeliv int
	}{
		{name: "clean", ops: map[opKey]outcome{a(1): acked, a(2): acked},
			ds: []delivery{d(1, false), d(2, false)}, valid: true},
		{name: "lost", ops: map[opKey]outcome{a(1): acked, a(2): acked},
			ds: []delivery{d(2, false)}, lost: 1},
		{name: "marked duplicate", ops: map[opKey]outcome{a(1): acked},
			ds: []delivery{d(1, false), d(1, true)}, valid: true, dupMarked: 1},
		{name: "unmarked duplicate", ops: map[opKey]outcome{a(1): acked},
			ds: []delivery{d(1, false), d(1, false)}, dupUnmark: 1},
		{name: "duplicate with another id", ops: map[opKey]outcome{a(1): acked},
			ds: []delivery{d(1, false), {op: a(1), node: "beta", msgID: "other", marked: true}}, dupMarked: 1, idChanged: 1},
		{name: "refused but delivered", ops: map[opKey]outcome{a(1): refused},
			ds: []delivery{d(1, false)}, unexpected: 1},
		{name: "never submitted", ops: map[opKey]outcome{a(1): acked},
			ds: []delivery{d(1, false), d(7, false)}, unexpected: 1},
		{name: "not a payload", ops: map[opKey]outcome{},
			ds: []delivery{{bad: true, node: "beta"}}, unexpected: 1},
		{name: "indeterminate either way", ops: map[opKey]outcome{a(1): indeterminate, a(2): indeterminate},
			ds: []delivery{d(2, false)}, valid: true, indetDeliv: 1},
		{name: "out of order", ops: map[opKey]outcome{a(1): acked, a(2): acked, a(3): acked},
			ds: []delivery{d(2, false), d(1, false), d(3, false)}, valid: true, inversions: 1},
		{name: "redelivery does not count as inversion", ops: map[opKey]outcome{a(1): acked, a(2): acked},
			ds: []delivery{d(1, false), d(2, false), d(1, true)}, valid: true, dupMarked: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := check(tt.ops, tt.ds)
			got := []int{len(r.lost), r.dupMarked, len(r.dupUnmarked), len(r.unexpected), len(r.idChanged), r.totalInversions(), r.indeterminateDelivered}
			want := []int{tt.lost, tt.dupMarked, tt.dupUnmark, tt.unexpected, tt.idChanged, tt.inversions, tt.indetDeliv}
			if !slices.Equal(got, want) {
				t.Errorf("lost, dup marked, dup unmarked, unexpected, id changed, inversions, indeterminate delivered: got %v, want %v\n%s", got, want, r)
			}
			if r.valid() != tt.valid {
				t.Errorf("valid: got %t, want %t\n%s", r.valid(), tt.valid, r)
			}
		})
	}
}

func TestPayloadRoundTrip(t *testing.T) {
	k, ok := parsePayload(payload("alpha", 42))
	if !ok || k != (opKey{"alpha", 42}) {
		t.Fatalf("parsePayload(payload(alpha, 42)): got %v %t, want alpha:42 true", k, ok)
	}
	k, ok = parsePayload(paddedPayload("beta", 7, 100))
	if !ok || k != (opKey{"beta", 7}) {
		t.Fatalf("parsePayload(paddedPayload(beta, 7, 100)): got %v %t, want beta:7 true", k, ok)
	}
	for _, bad := range []string{"", "alpha", ":1", "alpha:x", "alpha:-1", "alpha:1x|"} {
		if _, ok := parsePayload([]byte(bad)); ok {
			t.Errorf("parsePayload(%q): got ok, want not a payload", bad)
		}
	}
}
