package bridge_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// A handler's failure text is the program's own words: on a retry copy,
// on the dead letters (of spent attempts and of a permanent failure) and
// on a replay, the broker reads only the reasons' classes, while the node
// hosting the stage lists, shows and replays them with the text opened,
// and the handler of the replay sees it in Meshbox-Replayed.
func TestFailureReasonsSealedOnTheBroker(t *testing.T) {
	const marker = "customer-4711-has-no-credit"
	a, b, _ := sealedPerNodePair(t, []string{"picky"}, func(c *bridge.Config) {
		c.Retry = map[string]bridge.RetryPolicy{"picky": {Attempts: 2, Backoff: 200 * time.Millisecond}}
	})
	tap := adminTap(t, a, "cmd.#", "retry.#", "dead.#")
	ctx := context.Background()
	calls := answerStage(t, b, "picky", func(i int, m *nats.Msg) *nats.Msg {
		switch {
		case m.Header.Get(codec.HeaderReplayed) != "":
			return nats.NewMsg("")
		case m.Header.Get("X-Permanent") != "":
			return failure(strconv.Itoa(codec.CodePermanent), "refused: "+marker)
		}
		return failure("500", "busy: "+marker)
	})
	a.submit(t, "picky", []byte("job"), nats.Header{codec.HeaderMsgID: {"picky-1"}})
	a.submit(t, "picky", []byte("job"), nats.Header{codec.HeaderMsgID: {"picky-2"}, "X-Permanent": {"yes"}})
	var list []bridge.DeadLetter
	meshtest.WaitFor(t, 15*time.Second, "two dead letters", func() bool {
		var err error
		list, err = b.b.DeadLetters(ctx, "picky")
		return err == nil && len(list) == 2
	})
	reasons := map[string]string{}
	for _, dl := range list {
		reasons[dl.ID] = dl.Reason
	}
	if r := reasons["picky-1"]; !strings.Contains(r, "attempt 2 of 2 failed") || !strings.Contains(r, "replied error 500 busy: "+marker) {
		t.Errorf("listed reason of picky-1: got %q, want the spent attempts and the handler's words", r)
	}
	if r := reasons["picky-2"]; !strings.Contains(r, "permanent failure at attempt 1") || !strings.Contains(r, "refused: "+marker) {
		t.Errorf("listed reason of picky-2: got %q, want the permanent failure and the handler's words", r)
	}
	shown, err := b.b.ShowDeadLetter(ctx, "picky", "picky-1")
	if err != nil {
		t.Fatal(err)
	}
	if shown.Reason != reasons["picky-1"] {
		t.Errorf("shown reason %q, want the listed one %q", shown.Reason, reasons["picky-1"])
	}
	// What the broker holds: the classes, and the texts sealed.
	if c := shown.Headers[codec.HeaderDeadReason]; c != "attempt 2 of 2 failed: handler of stage picky on node beta replied error 500" {
		t.Errorf("dead reason on the broker: got %q, want the class", c)
	}
	if c := shown.Headers[codec.HeaderLastReason]; c != "handler of stage picky on node beta replied error 500" {
		t.Errorf("last reason on the broker: got %q, want the class", c)
	}
	for _, k := range []string{codec.HeaderDeadReasonSealed, codec.HeaderLastReasonSealed} {
		if shown.Headers[k] == "" {
			t.Errorf("no %s on the dead letter: %v", k, shown.Headers)
		}
	}
	for k, v := range shown.Headers {
		if strings.Contains(v, marker) {
			t.Errorf("the dead letter's header %s on the broker holds the handler's words: %q", k, v)
		}
	}

	// Replayed: the handler sees why it had died; the broker does not.
	if n, err := b.b.ReplayDeadLetters(ctx, "picky", "picky-2"); err != nil || n != 1 {
		t.Fatalf("replay: got %d, %v", n, err)
	}
	var replayed string
	meshtest.WaitFor(t, 10*time.Second, "the replayed command", func() bool {
		for _, c := range calls() {
			if r := c.msg.Header.Get(codec.HeaderReplayed); r != "" {
				replayed = r
				return true
			}
		}
		return false
	})
	if !strings.Contains(replayed, "by beta") || !strings.Contains(replayed, "refused: "+marker) {
		t.Errorf("Meshbox-Replayed at the handler: got %q, want the replay and the handler's words", replayed)
	}

	// Everything published on cmd.#, retry.# and dead.#: no handler's words.
	seen := map[string]int{}
	for done := false; !done; {
		select {
		case d := <-tap:
			kind := strings.SplitN(d.RoutingKey, ".", 2)[0]
			if _, ok := d.Headers[codec.HeaderReplayedSealed]; ok {
				kind = "replay"
			}
			seen[kind]++
			if all := fmt.Sprintf("%v", d.Headers); strings.Contains(all, marker) || bytes.Contains(d.Body, []byte(marker)) {
				t.Errorf("the broker reads the handler's words on %s: %v", d.RoutingKey, d.Headers)
			}
			checkReasonClasses(t, d)
		case <-time.After(2 * time.Second):
			done = true
		}
	}
	t.Logf("read on the broker: %v", seen)
	for _, kind := range []string{"retry", "dead", "replay"} {
		if seen[kind] == 0 {
			t.Errorf("the tap saw no %s (saw %v): the test proves nothing for it", kind, seen)
		}
	}
}

// checkReasonClasses checks that each reason header d carries is a class
// with its text sealed beside it.
func checkReasonClasses(t *testing.T, d amqp.Delivery) {
	t.Helper()
	for plain, sealed := range map[string]string{codec.HeaderDeadReason: codec.HeaderDeadReasonSealed,
		codec.HeaderLastReason: codec.HeaderLastReasonSealed, codec.HeaderReplayed: codec.HeaderReplayedSealed} {
		if _, ok := d.Headers[plain]; !ok {
			continue
		}
		if v, _ := d.Headers[sealed].(string); v == "" {
			t.Errorf("%s on %s without %s: %v", plain, d.RoutingKey, sealed, d.Headers)
		}
	}
}
