package outbox

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestRecordRoundTrip(t *testing.T) {
	recs := []*Record{
		{Seq: 1, Kind: Command, Created: time.Unix(0, 1700000000123456789), Name: "resize.image", MsgID: "id-1",
			Header: nats.Header{"Content-Type": {"image/png"}, "X-Multi": {"a", "b"}}, Body: []byte("payload")},
		{Seq: 2, Kind: Event, Republished: true, Created: time.Unix(5, 0), Name: "t", MsgID: "id-2"},
		{Seq: 3, Kind: Local, Attempt: 4, Created: time.Unix(5, 0), Name: "s", MsgID: "x", Body: []byte{}},
		{Seq: 4, Kind: Dead, Created: time.Unix(5, 0), Name: "s", MsgID: "x", Reason: "attempt 5 of 5 failed"},
	}
	for _, r := range recs {
		data := r.Encode()
		got, err := decodeRecord(r.Seq, data)
		if err != nil {
			t.Fatalf("decode %v: %v", r.Kind, err)
		}
		if got.Kind != r.Kind || got.Republished != r.Republished || got.Attempt != r.Attempt ||
			!got.Created.Equal(r.Created) || got.Name != r.Name || got.MsgID != r.MsgID || got.Reason != r.Reason ||
			!bytes.Equal(got.Body, r.Body) || got.Size != int64(len(data)) {
			t.Errorf("round trip: got %+v, want %+v", got, r)
		}
		if len(r.Header) > 0 && !reflect.DeepEqual(got.Header, r.Header) {
			t.Errorf("headers: got %v, want %v", got.Header, r.Header)
		}
	}
}

func TestDecodeRecordRejects(t *testing.T) {
	good := (&Record{Kind: Command, Created: time.Unix(1, 0), Name: "s", MsgID: "id", Body: []byte("x")}).Encode()
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
	bad := (&Record{Kind: Command, Created: time.Unix(1, 0), Name: "a.*", MsgID: "id"}).Encode()
	if _, err := decodeRecord(1, bad); err == nil {
		t.Error("invalid name: got no error, want one")
	}
}

// FuzzDecodeRecord feeds arbitrary bytes to the outbox record decoder: it
// must never panic, and what it accepts must encode back to the same bytes
// modulo header order.
func FuzzDecodeRecord(f *testing.F) {
	f.Add((&Record{Kind: Command, Created: time.Unix(1, 0), Name: "s", MsgID: "id",
		Header: nats.Header{"K": {"v"}}, Body: []byte("x")}).Encode())
	f.Add([]byte{1, 2, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodeRecord(7, data)
		if err != nil {
			return
		}
		again, err := decodeRecord(7, r.Encode())
		if err != nil {
			t.Fatalf("re-decode of an accepted record failed: %v", err)
		}
		if again.Name != r.Name || again.MsgID != r.MsgID || !bytes.Equal(again.Body, r.Body) || again.Kind != r.Kind {
			t.Fatalf("re-decode differs: %+v vs %+v", again, r)
		}
	})
}
