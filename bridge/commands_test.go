package bridge

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/bridge/outbox"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// localBridge builds a bridge with an outbox and a local NATS server, not
// started and with no broker: tests drive its parts directly.
func localBridge(tb testing.TB) *Bridge {
	tb.Helper()
	return localBridgeWith(tb, outbox.Options{})
}

// localBridgeWith is localBridge with the outbox's CloseWait and
// BeforeCommit taken from opts (the rest is the bridge's).
func localBridgeWith(tb testing.TB, opts outbox.Options) *Bridge {
	tb.Helper()
	srv := natstest.Start(tb)
	dial := natstest.Dialer(srv)
	nc := natstest.Connect(tb, srv)
	b, err := New(Config{Node: "local", OutboxPath: filepath.Join(tb.TempDir(), "outbox.db"), Dial: dial,
		CommandTimeout: 2 * time.Second, Logger: slog.New(slog.DiscardHandler)}, nc)
	if err != nil {
		tb.Fatal(err)
	}
	bopts := b.outboxOptions()
	bopts.CloseWait, bopts.BeforeCommit = opts.CloseWait, opts.BeforeCommit
	ob, err := outbox.Open(b.cfg.OutboxPath, bopts)
	if err != nil {
		tb.Fatal(err)
	}
	b.files.ob = ob
	b.files.obRef.Store(ob)
	b.sub.seq.Store(ob.NextSeq())
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
	b := localBridgeWith(t, outbox.Options{BeforeCommit: func(batch []outbox.Change) error {
		for _, c := range batch {
			if c.Put != nil && c.Put.Kind == outbox.Command {
				return errors.New("injected disk error")
			}
		}
		return nil
	}})
	ctx := context.Background()
	r := &outbox.Record{Seq: b.sub.nextSeq(), Kind: outbox.Local, Name: "gone", MsgID: "m1", Body: []byte("x"), Created: time.Now()}
	putRecord(t, b, r)
	b.setState(StateConnected, "") // the link is up and nobody here serves the stage

	if !b.runLocalRecord(ctx, r) {
		t.Fatal("runLocalRecord reported the bridge closing")
	}
	if err := b.files.ob.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	left, err := b.files.ob.ReadAfter(0, 10, outbox.KindsOf(outbox.Local, outbox.Command))
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].Seq != r.Seq || left[0].Kind != outbox.Local {
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
	var r *outbox.Record // the original, set before anything is queued
	delWithDead := make(chan struct{}, 1)
	b := localBridgeWith(t, outbox.Options{BeforeCommit: func(batch []outbox.Change) error {
		dead, del := false, false
		for _, c := range batch {
			dead = dead || c.Put != nil && c.Put.Kind == outbox.Dead
			del = del || c.Delete == r.Seq
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
	}})
	ctx := context.Background()
	b.cfg.RetryBudget = 1 // the first failure spends the budget
	r = &outbox.Record{Seq: b.sub.nextSeq(), Kind: outbox.Local, Name: "failing", MsgID: "m1", Body: []byte("x"), Created: time.Now()}
	putRecord(t, b, r)
	hnc, err := b.cfg.Dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hnc.Close)
	if _, err := hnc.Subscribe(codec.SubjWorkPrefix+"failing", func(m *nats.Msg) {
		reply := nats.NewMsg(m.Reply)
		reply.Header.Set(codec.HeaderServiceError, "it failed")
		reply.Header.Set(codec.HeaderServiceErrorCode, "500")
		_ = m.RespondMsg(reply)
	}); err != nil {
		t.Fatal(err)
	}
	if err := hnc.Flush(); err != nil {
		t.Fatal(err)
	}

	if !b.runLocalRecord(ctx, r) {
		t.Fatal("runLocalRecord reported the bridge closing")
	}
	if err := b.files.ob.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-delWithDead:
		t.Fatal("the original was deleted in the dead letter's commit: its delete did not wait for the dead letter")
	default:
	}
	left, err := b.files.ob.ReadAfter(0, 10, outbox.KindsOf(outbox.Local, outbox.Dead))
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].Seq != r.Seq || left[0].Kind != outbox.Local {
		t.Fatalf("got %d records in the outbox (%v), want the original local command kept", len(left), left)
	}
	if got := b.sub.meshPending.Load(); got != 0 {
		t.Fatalf("got meshPending %d, want 0: the dead letter was never stored", got)
	}
}

// putRecord stores r in b's outbox as a submission does: reserved, then
// committed.
func putRecord(t *testing.T, b *Bridge, r *outbox.Record) {
	t.Helper()
	data := r.Encode()
	if err := b.files.ob.Reserve(int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if err := b.files.ob.Wait(context.Background(), func(done func(error)) { b.files.ob.Put(r, data, done) }); err != nil {
		t.Fatal(err)
	}
	r.Size = int64(len(data))
}
