package node

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"
)

// nopLink is a Link that sends nothing and remembers nothing.
type nopLink struct{}

func (nopLink) PublishSystem(context.Context, string, []byte) error      { return nil }
func (nopLink) SendSystem(context.Context, string, string, []byte) error { return nil }
func (nopLink) ProbeNode(context.Context, string, func()) error          { return nil }
func (nopLink) SetRoutes(map[string][]string)                            {}
func (nopLink) MarkGone(string, time.Time)                               {}

// BenchmarkHandleInfos measures the node's own work to take in the answers
// of 1,000 peers to its start query (no broker): the decode, the view and
// the effects.
func BenchmarkHandleInfos(b *testing.B) {
	const peers = 1000
	at := time.Now().UTC()
	bodies := make([][]byte, peers)
	for i := range peers {
		name := fmt.Sprintf("sim-%04d", i)
		bodies[i] = good(Message{V: 1, Type: TypeInfo, Node: name, To: "me", StartedAt: at, Seq: 1,
			Capabilities: []string{"echo", "sim." + name}, HeartbeatMS: 5000, Proto: 2})
	}
	for b.Loop() {
		n, err := New(Config{Name: "me", Link: nopLink{}, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		if err := n.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		for i, body := range bodies {
			n.HandleSystem(TypeInfo, body, fmt.Sprintf("sim-%04d", i))
		}
		for len(n.Routes()) < peers+1 {
			time.Sleep(100 * time.Microsecond)
		}
		_ = n.Close()
	}
}
