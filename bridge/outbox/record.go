package outbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/wire"
)

// Kind says what a record is and where it goes.
type Kind uint8

// The kinds of records. Every kind but Local is for the mesh.
const (
	Command Kind = 1 // command for the mesh: published to mesh cmd.<stage>
	Event   Kind = 2 // event for the mesh: published to mesh evt.<topic>
	Local   Kind = 3 // command for a stage hosted here, accepted while the link was down: run locally
	Dead    Kind = 4 // dead letter waiting for the link: published to mesh.dlx
)

func (k Kind) String() string {
	switch k {
	case Command:
		return "command"
	case Event:
		return "event"
	case Local:
		return "local command"
	case Dead:
		return "dead letter"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Kinds is a set of record kinds: bit 1<<k for each kind k in it.
type Kinds uint8

// KindsOf returns the set of the kinds ks.
func KindsOf(ks ...Kind) Kinds {
	var s Kinds
	for _, k := range ks {
		s |= 1 << k
	}
	return s
}

// Has reports whether s holds k.
func (s Kinds) Has(k Kind) bool { return s&(1<<k) != 0 }

// Record is one message in the outbox. Records are ordered by Seq, which
// is the order the node accepted them in. A record read from the outbox
// is a copy: the caller owns it and may change it (then Replace stores the
// change).
type Record struct {
	Seq         uint64
	Kind        Kind
	Republished bool   // may have reached the broker before: mark deliveries as possible duplicates
	Attempt     uint32 // local commands: failed attempts so far
	Created     time.Time
	Name        string // stage or topic
	MsgID       string
	Reason      string // dead letters: why (as the bridge writes it: the failure's class, and its text when that says more)
	Header      nats.Header
	Body        []byte

	Size int64 // encoded size: set by Encode, Replace and when the record is read
}

const (
	recordVersion   = 1
	flagRepublished = 1
)

// Encode returns the record's stored form, and sets r.Size to its length:
//
//	version kind flags | uvarint attempt | varint created (unix ns)
//	| str name | str msgID | str reason | uvarint nkeys {str key, uvarint nvals {str val}}
//	| bytes body
//
// where str and bytes are a uvarint length and the bytes.
func (r *Record) Encode() []byte {
	n := 3 + 3*binary.MaxVarintLen64 + len(r.Name) + len(r.MsgID) + len(r.Reason) + len(r.Body) + 4*binary.MaxVarintLen64
	for k, vs := range r.Header {
		n += len(k) + 2*binary.MaxVarintLen64
		for _, v := range vs {
			n += len(v) + binary.MaxVarintLen64
		}
	}
	b := make([]byte, 0, n)
	var flags byte
	if r.Republished {
		flags |= flagRepublished
	}
	b = append(b, recordVersion, byte(r.Kind), flags)
	b = binary.AppendUvarint(b, uint64(r.Attempt))
	b = binary.AppendVarint(b, r.Created.UnixNano())
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	str(r.Name)
	str(r.MsgID)
	str(r.Reason)
	b = binary.AppendUvarint(b, uint64(len(r.Header)))
	for k, vs := range r.Header {
		str(k)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			str(v)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(r.Body)))
	b = append(b, r.Body...)
	r.Size = int64(len(b))
	return b
}

var errRecordTruncated = errors.New("truncated")

// decodeRecord parses a stored record and checks it: its kind, and its
// name, id and headers by the rules every layer applies (package names,
// package wire). It never panics.
func decodeRecord(seq uint64, b []byte) (*Record, error) {
	r := &Record{Seq: seq, Size: int64(len(b))}
	if len(b) < 3 {
		return nil, errRecordTruncated
	}
	if b[0] != recordVersion {
		return nil, fmt.Errorf("unknown record version %d", b[0])
	}
	r.Kind = Kind(b[1])
	if r.Kind < Command || r.Kind > Dead {
		return nil, fmt.Errorf("unknown record kind %d", b[1])
	}
	r.Republished = b[2]&flagRepublished != 0
	p := b[3:]
	uv := func() (uint64, error) {
		v, n := binary.Uvarint(p)
		if n <= 0 {
			return 0, errRecordTruncated
		}
		p = p[n:]
		return v, nil
	}
	str := func() (string, error) {
		n, err := uv()
		if err != nil {
			return "", err
		}
		if n > uint64(len(p)) {
			return "", errRecordTruncated
		}
		s := string(p[:n])
		p = p[n:]
		return s, nil
	}
	att, err := uv()
	if err != nil || att > 1<<31 {
		return nil, errRecordTruncated
	}
	r.Attempt = uint32(att)
	ns, n := binary.Varint(p)
	if n <= 0 {
		return nil, errRecordTruncated
	}
	p = p[n:]
	r.Created = time.Unix(0, ns)
	if r.Name, err = str(); err != nil {
		return nil, err
	}
	if names.Capability(r.Name) != nil {
		return nil, fmt.Errorf("invalid name %q", r.Name)
	}
	if r.MsgID, err = str(); err != nil {
		return nil, err
	}
	if !wire.ValidID(r.MsgID) {
		return nil, fmt.Errorf("invalid message id %q", r.MsgID)
	}
	if r.Reason, err = str(); err != nil {
		return nil, err
	}
	nkeys, err := uv()
	if err != nil {
		return nil, err
	}
	if nkeys > uint64(len(p)) {
		return nil, errRecordTruncated
	}
	if nkeys > 0 {
		r.Header = make(nats.Header, nkeys)
	}
	for i := uint64(0); i < nkeys; i++ {
		k, err := str()
		if err != nil {
			return nil, err
		}
		if !wire.ValidHeaderKey(k) {
			return nil, fmt.Errorf("invalid header key %q", k)
		}
		nv, err := uv()
		if err != nil {
			return nil, err
		}
		if nv > uint64(len(p)) {
			return nil, errRecordTruncated
		}
		vs := make([]string, 0, nv)
		for j := uint64(0); j < nv; j++ {
			v, err := str()
			if err != nil {
				return nil, err
			}
			if !wire.ValidHeaderValue(v) {
				return nil, fmt.Errorf("header %s has a line break", k)
			}
			vs = append(vs, v)
		}
		r.Header[k] = vs
	}
	nb, err := uv()
	if err != nil {
		return nil, err
	}
	if nb != uint64(len(p)) {
		return nil, fmt.Errorf("body length %d, %d bytes left", nb, len(p))
	}
	r.Body = append([]byte(nil), p...)
	return r, nil
}
