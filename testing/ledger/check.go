package ledger

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Result is the verdict on one stream of deliveries.
type Result struct {
	Acked, Refused, Indeterminate int
	Deliveries                    int

	Lost        []Op       // acked, never delivered
	DupMarked   int        // deliveries after the first, marked as redeliveries
	DupUnmarked []Delivery // deliveries after the first without the mark
	IDChanged   []Delivery // later deliveries whose message id differs from the first's
	Unexpected  []Delivery // refused or never submitted, or not a payload
	// IndeterminateDelivered counts submissions without an answer that
	// arrived (allowed either way).
	IndeterminateDelivered int
	// Inversions counts, per "node<-origin", first deliveries that
	// arrived after a first delivery with a higher sequence number.
	Inversions map[string]int
}

// Check judges deliveries ds against the submissions ops: each
// submission must arrive once in ds.
func Check(ops map[Op]Outcome, ds []Delivery) Result {
	r := Result{Deliveries: len(ds), Inversions: map[string]int{}}
	for _, o := range ops {
		switch o {
		case Acked:
			r.Acked++
		case Refused:
			r.Refused++
		case Indeterminate:
			r.Indeterminate++
		}
	}
	first := map[Op]Delivery{}
	highest := map[string]int{} // node<-origin: highest seq delivered first so far
	for _, d := range ds {
		if d.Bad {
			r.Unexpected = append(r.Unexpected, d)
			continue
		}
		o, known := ops[d.Op]
		if !known || o == Refused {
			r.Unexpected = append(r.Unexpected, d)
			continue
		}
		if f, seen := first[d.Op]; seen {
			if d.Marked {
				r.DupMarked++
			} else {
				r.DupUnmarked = append(r.DupUnmarked, d)
			}
			if d.MsgID != f.MsgID {
				r.IDChanged = append(r.IDChanged, d)
			}
			continue
		}
		first[d.Op] = d
		if o == Indeterminate {
			r.IndeterminateDelivered++
		}
		stream := d.Node + "<-" + d.Op.Origin
		if hi, ok := highest[stream]; ok && d.Op.Seq < hi {
			r.Inversions[stream]++
		} else {
			highest[stream] = d.Op.Seq
		}
		if _, ok := r.Inversions[stream]; !ok {
			r.Inversions[stream] = 0
		}
	}
	for k, o := range ops {
		if _, ok := first[k]; o == Acked && !ok {
			r.Lost = append(r.Lost, k)
		}
	}
	slices.SortFunc(r.Lost, func(a, b Op) int {
		return cmp.Or(cmp.Compare(a.Origin, b.Origin), cmp.Compare(a.Seq, b.Seq))
	})
	return r
}

// Valid reports whether nothing acknowledged was lost, every duplicate was
// marked and kept its message id, and nothing arrived that should not
// have.
func (r Result) Valid() bool {
	return len(r.Lost) == 0 && len(r.DupUnmarked) == 0 && len(r.IDChanged) == 0 && len(r.Unexpected) == 0
}

// TotalInversions sums the order inversions of every stream.
func (r Result) TotalInversions() int {
	n := 0
	for _, v := range r.Inversions {
		n += v
	}
	return n
}

// String is the checker's report, one line per finding, with examples.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "submitted: %d acked, %d refused, %d indeterminate (%d of them delivered); %d deliveries\n",
		r.Acked, r.Refused, r.Indeterminate, r.IndeterminateDelivered, r.Deliveries)
	fmt.Fprintf(&b, "lost: %d%s\n", len(r.Lost), examples(r.Lost))
	fmt.Fprintf(&b, "duplicated: %d (%d marked redeliveries, %d unmarked%s)\n",
		r.DupMarked+len(r.DupUnmarked), r.DupMarked, len(r.DupUnmarked), examples(r.DupUnmarked))
	fmt.Fprintf(&b, "message id changed on redelivery: %d%s\n", len(r.IDChanged), examples(r.IDChanged))
	fmt.Fprintf(&b, "unexpected: %d%s\n", len(r.Unexpected), examples(r.Unexpected))
	streams := slices.Sorted(maps.Keys(r.Inversions))
	fmt.Fprintf(&b, "order inversions:")
	for _, s := range streams {
		fmt.Fprintf(&b, " %s=%d", s, r.Inversions[s])
	}
	if len(streams) == 0 {
		b.WriteString(" none delivered")
	}
	if r.Valid() {
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
