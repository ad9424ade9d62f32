package rows_test

import (
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// A node resuming a log whose first delivery comes later than it waits
// for (a broker just restarted recovers its streams first; minutes on a
// busy small machine) keeps its place: silence is not a new log. With
// the wait shorter than any delivery, a node that took the silence for a
// replaced log would read the log again from its start and show a gap
// and log_replaced. The control: a log really deleted and made anew is
// still seen at once (TestADeletedLogIsSeen; here too, after the check).
func TestASlowLogIsNotAReplacedOne(t *testing.T) {
	if testing.Short() {
		t.Skip("uses RabbitMQ")
	}
	amqpURL := meshtest.RabbitMQ(t).Vhost(t)
	key := seal.NewContentKey()
	a := startNode(t, "alpha", amqpURL, keyring(t, key), t.TempDir(), 1000)
	defer a.e.Close()
	bdir := t.TempDir()
	b := startNode(t, "beta", amqpURL, keyring(t, key), bdir, 1000)
	putRows(t, a, 0, 8)
	meshtest.WaitFor(t, 30*time.Second, "beta holding alpha's rows", func() bool {
		return same(stateOf(t, b.e, "jobs"), stateOf(t, a.e, "jobs"))
	})
	off := tableStatus(t, b.e, "jobs").Offset
	if err := b.e.Close(); err != nil {
		t.Fatal(err)
	}
	// No delivery comes within a microsecond of the consumer's start.
	undo := rows.SetResumeWait(time.Microsecond)
	defer undo()
	b = startNode(t, "beta", amqpURL, keyring(t, key), bdir, 1000)
	defer b.e.Close()
	putRows(t, a, 8, 10)
	meshtest.WaitFor(t, 30*time.Second, "beta holding alpha's later rows", func() bool {
		return same(stateOf(t, b.e, "jobs"), stateOf(t, a.e, "jobs")) && tableStatus(t, b.e, "jobs").Synced
	})
	st := tableStatus(t, b.e, "jobs")
	t.Logf("beta resumed at %d; status %+v", off, st)
	if st.Refused["log_replaced"] != 0 || st.Gap || st.Offset < off {
		t.Errorf("beta, resuming a log that answered later than it waited, took it for a new one (status %+v); want no log_replaced, no gap, offset at least %d", st, off)
	}
}
