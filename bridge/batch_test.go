package bridge

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	amqp "github.com/rabbitmq/amqp091-go"
)

func batchOf(ps ...amqp.Publishing) amqp.Delivery {
	size := 16
	for i := range ps {
		size += codec.EntrySize(&ps[i])
	}
	return amqp.Delivery{
		Type: codec.TypeCommandBatch, RoutingKey: "cmd.resize", UserId: "node.alpha.g1", DeliveryTag: 7,
		Body: codec.EncodeBatch(ps, size), Headers: amqp.Table{},
	}
}

// Every command of a batch comes out as the delivery it would have been
// alone: its own id, timestamp, properties, headers and body; the batch's
// routing key, user_id, tag and redelivery.
func TestBatchRoundTrip(t *testing.T) {
	at := time.UnixMilli(1_790_000_000_123)
	ps := []amqp.Publishing{
		{MessageId: "m1", Timestamp: at, ContentType: "text/plain", Headers: amqp.Table{codec.HeaderKey: "k1", "X-Multi": []any{"a", "b"}}, Body: []byte("one")},
		{MessageId: "m2", Timestamp: at.Add(time.Millisecond), Headers: amqp.Table{}, Body: nil},
		{MessageId: "m3", Timestamp: at, ContentEncoding: "gzip", Headers: amqp.Table{codec.HeaderAttempts: "2"}, Body: bytes.Repeat([]byte("x"), 1000)},
	}
	d := batchOf(ps...)
	d.Redelivered = true
	d.Headers[codec.HeaderDeliveryCount] = int64(3)
	got, err := codec.DecodeBatch(&d, codec.MaxCommandBatch, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ps) {
		t.Fatalf("%d commands, want %d", len(got), len(ps))
	}
	for i, e := range got {
		p := ps[i]
		if e.MessageId != p.MessageId || !e.Timestamp.Equal(p.Timestamp) || e.ContentType != p.ContentType ||
			e.ContentEncoding != p.ContentEncoding || !bytes.Equal(e.Body, p.Body) {
			t.Errorf("command %d: got %+v, want %+v", i, e, p)
		}
		if e.Type != codec.TypeCommand || e.RoutingKey != d.RoutingKey || e.UserId != d.UserId || e.DeliveryTag != 7 || !e.Redelivered {
			t.Errorf("command %d: type %q key %q user %q tag %d redelivered %v, want the batch's", i, e.Type, e.RoutingKey, e.UserId, e.DeliveryTag, e.Redelivered)
		}
		if e.Headers[codec.HeaderDeliveryCount] != int64(3) {
			t.Errorf("command %d: delivery count %v, want the batch's 3", i, e.Headers[codec.HeaderDeliveryCount])
		}
		for k, v := range p.Headers {
			switch v := v.(type) {
			case string:
				if e.Headers[k] != v {
					t.Errorf("command %d: header %s = %v, want %q", i, k, e.Headers[k], v)
				}
			case []any:
				arr, _ := e.Headers[k].([]any)
				if len(arr) != len(v) || arr[0] != v[0] || arr[1] != v[1] {
					t.Errorf("command %d: header %s = %v, want %v", i, k, e.Headers[k], v)
				}
			}
		}
	}
}

// A publisher cannot make a command of a batch look like a retry: an
// x-delivery-count of its own is dropped, and only the broker's count of
// the batch counts.
func TestBatchDropsPublishersBrokerHeaders(t *testing.T) {
	d := batchOf(amqp.Publishing{MessageId: "m1", Headers: amqp.Table{codec.HeaderDeliveryCount: "9", "x-death": "forged"}})
	got, err := codec.DecodeBatch(&d, codec.MaxCommandBatch, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got[0].Headers[codec.HeaderDeliveryCount]; ok {
		t.Errorf("a publisher's %s survived: %v", codec.HeaderDeliveryCount, got[0].Headers)
	}
	if _, ok := got[0].Headers["x-death"]; ok {
		t.Errorf("a publisher's x-death survived: %v", got[0].Headers)
	}
}

func TestBatchRefusesBadBodies(t *testing.T) {
	good := batchOf(amqp.Publishing{MessageId: "m1", Body: []byte("one")}, amqp.Publishing{MessageId: "m2", Body: []byte("two")})
	for name, tc := range map[string]struct {
		body  []byte
		max   int
		limit int
	}{
		"empty":          {nil, 64, 1 << 20},
		"unknown format": {append([]byte{9}, good.Body[1:]...), 64, 1 << 20},
		"too many":       {good.Body, 1, 1 << 20},
		"too large":      {good.Body, 64, 10},
		"cut short":      {good.Body[:len(good.Body)-1], 64, 1 << 20},
		"trailing bytes": {append(append([]byte{}, good.Body...), 0), 64, 1 << 20},
		"zero commands":  {[]byte{codec.BatchVersion, 0}, 64, 1 << 20},
	} {
		t.Run(name, func(t *testing.T) {
			d := amqp.Delivery{Type: codec.TypeCommandBatch, RoutingKey: "cmd.x", Body: tc.body}
			if got, err := codec.DecodeBatch(&d, tc.max, tc.limit); err == nil {
				t.Fatalf("accepted %d commands", len(got))
			} else if _, ok := err.(*codec.Malformed); !ok {
				t.Fatalf("error %T %v, want a malformed message (dead-lettered with the reason)", err, err)
			}
		})
	}
}

// decodeBatch never panics and never returns a command outside the body.
func FuzzDecodeBatch(f *testing.F) {
	f.Add(batchOf(amqp.Publishing{MessageId: "m1", Headers: amqp.Table{"a": "b"}, Body: []byte("x")}).Body)
	f.Add(batchOf(amqp.Publishing{MessageId: "m1"}, amqp.Publishing{MessageId: "m2", Headers: amqp.Table{"k": []any{"1", "2"}}}).Body)
	f.Add([]byte{codec.BatchVersion, 1, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, body []byte) {
		d := amqp.Delivery{Type: codec.TypeCommandBatch, RoutingKey: "cmd.x", Body: body}
		got, err := codec.DecodeBatch(&d, codec.MaxCommandBatch, 1<<20)
		if err != nil {
			return
		}
		if len(got) < 1 || len(got) > codec.MaxCommandBatch {
			t.Fatalf("%d commands", len(got))
		}
		total := 0
		for _, e := range got {
			total += len(e.Body) + len(e.MessageId)
		}
		if total > len(body) {
			t.Fatalf("commands hold %d bytes of a %d-byte body", total, len(body))
		}
	})
}

// The publisher gathers the commands of one stage in a run into batches
// of at most max, each at the place of its first command; a command alone
// and everything that is not a command keep their places; every command
// is settled once, with its batch's outcome.
func TestPackCommands(t *testing.T) {
	s := &session{b: &Bridge{cfg: Config{Node: "alpha", MaxPayload: 1 << 20}}, user: "node.alpha.g1"}
	var settled []string
	cmd := func(stage, id string) *pubItem {
		return &pubItem{Out: &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: codec.CommandKey(stage), Mandatory: true, Kind: codec.TypeCommand,
			MsgID: id, Persist: true, Body: []byte(id), At: time.Now()}, Done: func(err error) {
			settled = append(settled, id)
		}}
	}
	event := &pubItem{Out: &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: "evt.t", Kind: codec.TypeEvent, MsgID: "e", Persist: true}, Done: func(error) {}}
	items := []*pubItem{cmd("a", "a1"), cmd("b", "b1"), event, cmd("a", "a2"), cmd("a", "a3"), cmd("a", "a4"), cmd("c", "c1")}
	out := s.packCommands(items, 2)
	var got []string
	for _, it := range out {
		switch {
		case it.Out.Batch > 0:
			ids, err := DecodeBatchIDs(it.Out.Raw.Body)
			if err != nil {
				t.Fatal(err)
			}
			if it.Out.Raw.Type != codec.TypeCommandBatch || it.Out.Key != codec.CommandKey("a") || len(ids) != it.Out.Batch {
				t.Fatalf("batch %+v with %v", it.Out, ids)
			}
			got = append(got, fmt.Sprint(ids))
		default:
			got = append(got, it.Out.MsgID)
		}
	}
	want := []string{"[a1 a2]", "b1", "e", "[a3 a4]", "c1"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("run packed as %v, want %v", got, want)
	}
	for _, it := range out {
		it.Finish(nil)
	}
	if fmt.Sprint(settled) != "[a1 a2 b1 a3 a4 c1]" {
		t.Fatalf("settled %v, want each command once", settled)
	}
}
