package bridge

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestRecordRoundTrip(t *testing.T) {
	recs := []*record{
		{seq: 1, kind: kindCommand, created: time.Unix(0, 1700000000123456789), name: "resize.image", msgID: "id-1",
			header: nats.Header{"Content-Type": {"image/png"}, "X-Multi": {"a", "b"}}, body: []byte("payload")},
		{seq: 2, kind: kindEvent, republished: true, created: time.Unix(5, 0), name: "t", msgID: "id-2"},
		{seq: 3, kind: kindLocal, attempt: 4, created: time.Unix(5, 0), name: "s", msgID: "x", body: []byte{}},
		{seq: 4, kind: kindDead, created: time.Unix(5, 0), name: "s", msgID: "x", reason: "attempt 5 of 5 failed"},
	}
	for _, r := range recs {
		data := r.encode()
		got, err := decodeRecord(r.seq, data)
		if err != nil {
			t.Fatalf("decode %v: %v", r.kind, err)
		}
		if got.kind != r.kind || got.republished != r.republished || got.attempt != r.attempt ||
			!got.created.Equal(r.created) || got.name != r.name || got.msgID != r.msgID || got.reason != r.reason ||
			!bytes.Equal(got.body, r.body) || got.size != int64(len(data)) {
			t.Errorf("round trip: got %+v, want %+v", got, r)
		}
		if len(r.header) > 0 && !reflect.DeepEqual(got.header, r.header) {
			t.Errorf("headers: got %v, want %v", got.header, r.header)
		}
	}
}

func TestDecodeRecordRejects(t *testing.T) {
	good := (&record{kind: kindCommand, created: time.Unix(1, 0), name: "s", msgID: "id", body: []byte("x")}).encode()
	tests := map[string][]byte{
		"empty":         nil,
		"version":       append([]byte{9}, good[1:]...),
		"kind":          append([]byte{good[0], 9}, good[2:]...),
		"truncated":     good[:len(good)-1],
		"trailing byte": append(append([]byte(nil), good...), 0),
	}
	for name, data := range tests {
		if _, err := decodeRecord(1, data); err == nil {
			t.Errorf("%s: got no error, want one", name)
		}
	}
	bad := (&record{kind: kindCommand, created: time.Unix(1, 0), name: "a.*", msgID: "id"}).encode()
	if _, err := decodeRecord(1, bad); err == nil {
		t.Error("invalid name: got no error, want one")
	}
}

// FuzzDecodeRecord feeds arbitrary bytes to the outbox record decoder: it
// must never panic, and what it accepts must encode back to the same bytes
// modulo header order.
func FuzzDecodeRecord(f *testing.F) {
	f.Add((&record{kind: kindCommand, created: time.Unix(1, 0), name: "s", msgID: "id",
		header: nats.Header{"K": {"v"}}, body: []byte("x")}).encode())
	f.Add([]byte{1, 2, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodeRecord(7, data)
		if err != nil {
			return
		}
		again, err := decodeRecord(7, r.encode())
		if err != nil {
			t.Fatalf("re-decode of an accepted record failed: %v", err)
		}
		if again.name != r.name || again.msgID != r.msgID || !bytes.Equal(again.body, r.body) || again.kind != r.kind {
			t.Fatalf("re-decode differs: %+v vs %+v", again, r)
		}
	})
}
