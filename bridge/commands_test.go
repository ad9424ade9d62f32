package bridge

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// localBridge builds a bridge with an outbox and a local NATS server, not
// started and with no broker: tests drive its parts directly.
func localBridge(tb testing.TB) *Bridge {
	tb.Helper()
	srv := natstest.Start(tb)
	dial := natstest.Dialer(srv)
	nc := natstest.Connect(tb, srv)
	b, err := New(Config{Node: "local", OutboxPath: filepath.Join(tb.TempDir(), "outbox.db"), Dial: dial,
		CommandTimeout: 2 * time.Second, Logger: slog.New(slog.DiscardHandler)}, nc)
	if err != nil {
		tb.Fatal(err)
	}
	ob, err := openOutbox(b.cfg.OutboxPath, b.cfg.OutboxMaxBytes, b.log)
	if err != nil {
		tb.Fatal(err)
	}
	b.ob = ob
	b.obRef.Store(ob)
	b.sub.seq.Store(ob.nextSeq())
	ob.start(b.onOutboxCommit)
	if b.bc, err = dial(); err != nil {
		tb.Fatal(err)
	}
	close(b.life.bcClosed) // bc has no closed handler here
	tb.Cleanup(func() {
		if err := b.Close(); err != nil && !errors.Is(err, ErrOutboxStuck) {
			tb.Errorf("close: %v", err)
		}
	})
	return b
}

// A local command whose stage is no longer hosted here moves to the mesh.
// When writing the moved copy fails, the original must stay (nothing is
// lost) and meshPending must not count a record that was never stored
// (or every later submission would queue behind it in the outbox).
func TestLocalCommandKeptWhenItsMoveToTheMeshFails(t *testing.T) {
	b := localBridge(t)
	ctx := context.Background()
	r := &record{seq: b.sub.nextSeq(), kind: kindLocal, name: "gone", msgID: "m1", body: []byte("x"), created: time.Now()}
	data := r.encode()
	if err := b.ob.reserve(int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if err := b.ob.wait(ctx, func(done func(error)) { b.ob.put(r, data, done) }); err != nil {
		t.Fatal(err)
	}
	r.size = int64(len(data))
	b.ob.testCommit = func(batch []obOp) error {
		for _, op := range batch {
			if op.put != nil && op.put.kind == kindCommand {
				return errors.New("injected disk error")
			}
		}
		return nil
	}
	b.setState(StateConnected, "") // the link is up and nobody here serves the stage

	if !b.runLocalRecord(ctx, r) {
		t.Fatal("runLocalRecord reported the bridge closing")
	}
	if err := b.ob.sync(ctx); err != nil {
		t.Fatal(err)
	}
	left, err := b.ob.readAfter(0, 10, 1<<kindLocal|1<<kindCommand)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].seq != r.seq || left[0].kind != kindLocal {
		t.Fatalf("got %d records in the outbox (%v), want the original local command kept", len(left), left)
	}
	if got := b.sub.meshPending.Load(); got != 0 {
		t.Fatalf("got meshPending %d, want 0: the moved copy was never stored", got)
	}
}

// A local command that spent its retry budget is dead-lettered through the
// outbox. When writing the dead letter fails, the original must stay (the
// command is not lost) and meshPending must not count the dead letter that
// was never stored. The original may be deleted only after the dead letter
// committed: a delete queued in the same group commit as the dead letter
// was sent without waiting for it.
func TestLocalCommandKeptWhenItsDeadLetterFails(t *testing.T) {
	b := localBridge(t)
	ctx := context.Background()
	b.cfg.RetryBudget = 1 // the first failure spends the budget
	r := &record{seq: b.sub.nextSeq(), kind: kindLocal, name: "failing", msgID: "m1", body: []byte("x"), created: time.Now()}
	data := r.encode()
	if err := b.ob.reserve(int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if err := b.ob.wait(ctx, func(done func(error)) { b.ob.put(r, data, done) }); err != nil {
		t.Fatal(err)
	}
	r.size = int64(len(data))
	hnc, err := b.cfg.Dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hnc.Close)
	if _, err := hnc.Subscribe(subjWorkPrefix+"failing", func(m *nats.Msg) {
		reply := nats.NewMsg(m.Reply)
		reply.Header.Set(headerServiceError, "it failed")
		reply.Header.Set(headerServiceErrorCode, "500")
		_ = m.RespondMsg(reply)
	}); err != nil {
		t.Fatal(err)
	}
	if err := hnc.Flush(); err != nil {
		t.Fatal(err)
	}
	delWithDead := make(chan struct{}, 1)
	b.ob.testCommit = func(batch []obOp) error {
		dead, del := false, false
		for _, op := range batch {
			dead = dead || op.put != nil && op.put.kind == kindDead
			del = del || op.del == r.seq
		}
		if dead && del {
			select {
			case delWithDead <- struct{}{}:
			default:
			}
		}
		if dead {
			return errors.New("injected disk error")
		}
		return nil
	}

	if !b.runLocalRecord(ctx, r) {
		t.Fatal("runLocalRecord reported the bridge closing")
	}
	if err := b.ob.sync(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-delWithDead:
		t.Fatal("the original was deleted in the dead letter's commit: its delete did not wait for the dead letter")
	default:
	}
	left, err := b.ob.readAfter(0, 10, 1<<kindLocal|1<<kindDead)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].seq != r.seq || left[0].kind != kindLocal {
		t.Fatalf("got %d records in the outbox (%v), want the original local command kept", len(left), left)
	}
	if got := b.sub.meshPending.Load(); got != 0 {
		t.Fatalf("got meshPending %d, want 0: the dead letter was never stored", got)
	}
}
