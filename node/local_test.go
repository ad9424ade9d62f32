package node

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/nats-io/nats.go"
)

// mustSub returns a function that fails t when a subscription fails.
func mustSub(t *testing.T) func(*nats.Subscription, error) *nats.Subscription {
	return func(sub *nats.Subscription, err error) *nats.Subscription {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return sub
	}
}

func TestSetLocalAnnouncesAtOnceAndServesTheAPI(t *testing.T) {
	srv := natstest.Start(t)
	mesh := newFakeMesh()
	link := &fakeLink{mesh: mesh, name: "A", gone: map[string]time.Time{}, notify: make(chan struct{}, 1)}
	api := natstest.Connect(t, srv, nats.Name("meshbox-api"))
	n, err := New(Config{
		Name:   "A",
		Link:   link,
		Conn:   api,
		Logger: slog.New(slog.NewTextHandler(tbWriter{t}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	mesh.nodes["A"] = n
	// Before Start: the hello carries it.
	n.SetLocal([]string{"cap.first", "work.stage", "evt.x", "cap.>"})
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	if got := n.Capabilities(); !slices.Equal(got.Local, []string{"first"}) || !slices.Equal(got.LocalStages, []string{"stage"}) {
		t.Fatalf("after Start: got local %v stages %v, want [first] [stage]", got.Local, got.LocalStages)
	}

	// Each change is in the view when SetLocal returns, and is announced
	// to the mesh by the sender without waiting for the loop (this test's
	// node runs on the real clock; its loop sleeps until the next
	// heartbeat, 5s away).
	updates := func() int {
		var c int
		for _, k := range link.sentKeys() {
			if k == "sys.update" {
				c++
			}
		}
		return c
	}
	waitUpdates := func(want int) {
		t.Helper()
		timeout := time.After(2 * time.Second)
		for updates() < want {
			select {
			case <-link.notify:
			case <-timeout:
				t.Fatalf("updates sent: got %d, want %d (%v)", updates(), want, link.sentKeys())
			}
		}
		if got := updates(); got != want {
			t.Fatalf("updates sent: got %d, want %d (%v)", got, want, link.sentKeys())
		}
	}
	n.SetLocal([]string{"cap.echo"})
	if got := n.Capabilities().Local; !slices.Equal(got, []string{"echo"}) {
		t.Fatalf("local capabilities: got %v, want [echo]", got)
	}
	waitUpdates(1)
	n.SetLocal([]string{"cap.echo"}) // no change: no update
	n.SetLocal(nil)
	if got := n.Capabilities().Local; len(got) != 0 {
		t.Fatalf("local capabilities: got %v, want none", got)
	}
	waitUpdates(2)

	// The NATS API answers from the in-process connection.
	n.SetLocal([]string{"cap.api"})
	n.SetExpected([]string{"D"})
	client := natstest.ConnectTCP(t, srv, nats.Name("client"))
	msg, err := client.Request(SubjectPeers, nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var peers PeersReply
	if err := json.Unmarshal(msg.Data, &peers); err != nil {
		t.Fatal(err)
	}
	if peers.Node != "A" || len(peers.Peers) != 1 || peers.Peers[0].Name != "D" || peers.Peers[0].State != StateAbsent {
		t.Fatalf("%s: got %s, want node A with D expected-but-absent", SubjectPeers, msg.Data)
	}
	msg, err = client.Request(SubjectCaps, nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var caps CapsReply
	if err := json.Unmarshal(msg.Data, &caps); err != nil {
		t.Fatal(err)
	}
	if caps.Node != "A" || !slices.Equal(caps.Local, []string{"api"}) || caps.Remote == nil {
		t.Fatalf("%s: got %s, want node A with local [api]", SubjectCaps, msg.Data)
	}

	// After Close the API is withdrawn.
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Request(SubjectPeers, nil, time.Second); err == nil {
		t.Fatalf("%s answered after Close", SubjectPeers)
	}
}
