package cluster

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// The ledger keeps what submitters were told and what handlers and
// subscribers saw, as the fault tests of testing/e2e do: every submission
// the node acknowledged must be delivered, a duplicate must be marked
// Meshbox-Redelivered, and nothing refused may arrive. Payloads are
// "<seq>", so a delivery names its submission.

// outcome is what a submitter was told about one submission.
type outcome int

const (
	acked         outcome = iota // durable: must be delivered
	refused                      // an error reply: must never be delivered
	indeterminate                // no answer: may or may not be delivered
)

// ledger is safe for concurrent use.
type ledger struct {
	mu   sync.Mutex
	ops  map[int]outcome
	seen map[string]map[int][]bool // receiver -> seq -> marked, per delivery
	bad  int                       // deliveries whose body is no sequence number
}

func newLedger() *ledger {
	return &ledger{ops: map[int]outcome{}, seen: map[string]map[int][]bool{}}
}

func (l *ledger) submitted(seq int, o outcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ops[seq] = o
}

// delivered records m as seen by receiver (a node name, or one name for
// all handlers of a stage: a command is due once across them).
func (l *ledger) delivered(receiver string, m *nats.Msg) {
	seq, err := strconv.Atoi(string(m.Data))
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.bad++
		return
	}
	if l.seen[receiver] == nil {
		l.seen[receiver] = map[int][]bool{}
	}
	l.seen[receiver][seq] = append(l.seen[receiver][seq], m.Header.Get("Meshbox-Redelivered") == "true")
}

// tally is the ledger's verdict for one receiver.
type tally struct {
	acked, refused, unanswered int
	delivered                  int // distinct submissions delivered
	lost                       int // acknowledged, never delivered
	dupMarked, dupUnmarked     int // deliveries beyond the first
	unexpected                 int // refused or never submitted, yet delivered
	bad                        int
	lostExamples               []int
}

func (l *ledger) tally(receiver string) tally {
	l.mu.Lock()
	defer l.mu.Unlock()
	var t tally
	t.bad = l.bad
	for seq, o := range l.ops {
		switch o {
		case acked:
			t.acked++
			if len(l.seen[receiver][seq]) == 0 {
				t.lost++
				if len(t.lostExamples) < 10 {
					t.lostExamples = append(t.lostExamples, seq)
				}
			}
		case refused:
			t.refused++
		case indeterminate:
			t.unanswered++
		}
	}
	for seq, marks := range l.seen[receiver] {
		t.delivered++
		if o, ok := l.ops[seq]; !ok || o == refused {
			t.unexpected++
		}
		unmarked := 0
		for _, m := range marks {
			if !m {
				unmarked++
			}
		}
		extra := len(marks) - 1
		// The first delivery may be unmarked; every other one must not.
		un := max(0, unmarked-1)
		t.dupUnmarked += un
		t.dupMarked += extra - un
	}
	return t
}

func (t tally) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "acked %d, refused %d, unanswered %d; delivered %d, lost %d, duplicates %d marked %d unmarked, unexpected %d",
		t.acked, t.refused, t.unanswered, t.delivered, t.lost, t.dupMarked, t.dupUnmarked, t.unexpected)
	if t.bad > 0 {
		fmt.Fprintf(&b, ", %d bad bodies", t.bad)
	}
	if len(t.lostExamples) > 0 {
		fmt.Fprintf(&b, "; lost e.g. %v", t.lostExamples)
	}
	return b.String()
}
