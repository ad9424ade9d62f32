package bridge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
)

// recordKind says what an outbox record is and where it goes.
type recordKind uint8

const (
	kindCommand recordKind = 1 // command for the mesh: published to mesh cmd.<stage>
	kindEvent   recordKind = 2 // event for the mesh: published to mesh evt.<topic>
	kindLocal   recordKind = 3 // command for a stage hosted here, accepted while the link was down: run locally
	kindDead    recordKind = 4 // dead letter waiting for the link: published to mesh.dlx
)

func (k recordKind) String() string {
	switch k {
	case kindCommand:
		return "command"
	case kindEvent:
		return "event"
	case kindLocal:
		return "local command"
	case kindDead:
		return "dead letter"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// record is one message in the outbox. Records are ordered by seq, which
// is the order the node accepted them in.
type record struct {
	seq         uint64
	kind        recordKind
	republished bool   // may have reached the broker before: mark deliveries as possible duplicates
	attempt     uint32 // local commands: failed attempts so far
	created     time.Time
	name        string // stage or topic
	msgID       string
	reason      string // dead letters: why (joinReason: its class, and its text when that says more)
	header      nats.Header
	body        []byte

	size int64 // encoded size, set by encode and decodeRecord
}

const (
	recordVersion   = 1
	flagRepublished = 1
)

// encode returns the record's stored form:
//
//	version kind flags | uvarint attempt | varint created (unix ns)
//	| str name | str msgID | str reason | uvarint nkeys {str key, uvarint nvals {str val}}
//	| bytes body
//
// where str and bytes are a uvarint length and the bytes.
func (r *record) encode() []byte {
	n := 3 + 3*binary.MaxVarintLen64 + len(r.name) + len(r.msgID) + len(r.reason) + len(r.body) + 4*binary.MaxVarintLen64
	for k, vs := range r.header {
		n += len(k) + 2*binary.MaxVarintLen64
		for _, v := range vs {
			n += len(v) + binary.MaxVarintLen64
		}
	}
	b := make([]byte, 0, n)
	var flags byte
	if r.republished {
		flags |= flagRepublished
	}
	b = append(b, recordVersion, byte(r.kind), flags)
	b = binary.AppendUvarint(b, uint64(r.attempt))
	b = binary.AppendVarint(b, r.created.UnixNano())
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	str(r.name)
	str(r.msgID)
	str(r.reason)
	b = binary.AppendUvarint(b, uint64(len(r.header)))
	for k, vs := range r.header {
		str(k)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			str(v)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(r.body)))
	b = append(b, r.body...)
	r.size = int64(len(b))
	return b
}

var errRecordTruncated = errors.New("truncated")

// decodeRecord parses a stored record and checks it. It never panics.
func decodeRecord(seq uint64, b []byte) (*record, error) {
	r := &record{seq: seq, size: int64(len(b))}
	if len(b) < 3 {
		return nil, errRecordTruncated
	}
	if b[0] != recordVersion {
		return nil, fmt.Errorf("unknown record version %d", b[0])
	}
	r.kind = recordKind(b[1])
	if r.kind < kindCommand || r.kind > kindDead {
		return nil, fmt.Errorf("unknown record kind %d", b[1])
	}
	r.republished = b[2]&flagRepublished != 0
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
	r.attempt = uint32(att)
	ns, n := binary.Varint(p)
	if n <= 0 {
		return nil, errRecordTruncated
	}
	p = p[n:]
	r.created = time.Unix(0, ns)
	if r.name, err = str(); err != nil {
		return nil, err
	}
	if !validName(r.name) {
		return nil, fmt.Errorf("invalid name %q", r.name)
	}
	if r.msgID, err = str(); err != nil {
		return nil, err
	}
	if !wire.ValidID(r.msgID) {
		return nil, fmt.Errorf("invalid message id %q", r.msgID)
	}
	if r.reason, err = str(); err != nil {
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
		r.header = make(nats.Header, nkeys)
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
		r.header[k] = vs
	}
	nb, err := uv()
	if err != nil {
		return nil, err
	}
	if nb != uint64(len(p)) {
		return nil, fmt.Errorf("body length %d, %d bytes left", nb, len(p))
	}
	r.body = append([]byte(nil), p...)
	return r, nil
}
