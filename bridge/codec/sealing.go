package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	SealedVersion = 1
	SealADLabel   = "meshbox message v1"
	// MaxClockSkew is how far nodes' clocks may disagree: a request is
	// refused once its sealed deadline is this far behind.
	MaxClockSkew = 2 * time.Second
)

// HeaderKey names the content key a message is sealed with.
const HeaderKey = wire.HeaderKey

// Reasons a message does not open, in meshbox_unseal_failures_total and
// in the refusal.
const (
	UnsealTampered   = "tampered"    // does not open: changed, or moved to another route or origin
	UnsealUnknownKey = "unknown_key" // sealed with a key this node does not hold
	UnsealNotSealed  = "not_sealed"  // plain, where the mesh seals
	UnsealExpired    = "expired"     // a request past its sealed deadline: late or replayed
	UnsealMalformed  = "malformed"   // opened, but its content is not valid
	UnsealWrongScope = "wrong_scope" // a scoped name sealed with a key of another scope or the mesh's, or not a member
)

// UnsealError is a message that cannot be opened. env is what routing
// could read (to answer a request, or settle a reply).
type UnsealError struct {
	Reason string
	Detail string
	Env    *Envelope
	// lagging: wrong_scope, but sealed with a key of a scope this node is
	// in, for a name its bindings bind elsewhere: the sender may have read
	// a change of the scope's bindings this node has not read yet.
	Lagging bool
}

func (e *UnsealError) Error() string {
	return "sealed message refused (" + e.Reason + "): " + e.Detail
}

// AsUnseal returns err as an *UnsealError, or nil.
func AsUnseal(err error) *UnsealError {
	var ue *UnsealError
	if errors.As(err, &ue) {
		return ue
	}
	return nil
}

// Sealable reports whether a message of kind carries a program's content.
func Sealable(kind string) bool {
	return kind == TypeRequest || kind == TypeReply || kind == TypeCommand || kind == TypeEvent
}

// SealAD appends the associated data of a message to dst. A key of a
// scope adds the scope; the mesh's keys add nothing (so messages sealed
// with them are as before scopes existed).
func SealAD(dst []byte, kind, key, msgID, corrID, replyTo, origin, keyID, scope string) []byte {
	if scope == "" {
		return seal.AssociatedData(dst, SealADLabel, kind, key, msgID, corrID, replyTo, origin, keyID)
	}
	return seal.AssociatedData(dst, SealADLabel, kind, key, msgID, corrID, replyTo, origin, keyID, scope)
}

// sealInto seals o's headers and body into p: p.Body becomes the sealed
// form, the application headers and the content properties go inside, and
// Meshbox-Key names the key. One allocation holds the plaintext (sealed in
// place) and the associated data.
func (o *Outgoing) sealInto(p *amqp.Publishing, keys *seal.Keyring, origin string) error {
	scope := o.Scope
	if o.Kind != TypeReply {
		scope = OutgoingScope(keys, o.Kind, o.Key)
	}
	sl, err := keys.SealerFor(scope)
	if err != nil {
		if scope != "" {
			return fmt.Errorf("scope %s: %w", scope, err)
		}
		return err
	}
	n := 1 + 2*binary.MaxVarintLen64 + binary.MaxVarintLen64 + len(o.Body)
	for k, vs := range o.Header {
		n += len(k) + 2*binary.MaxVarintLen64
		for _, v := range vs {
			n += len(v) + binary.MaxVarintLen64
		}
	}
	adLen := 64 + len(SealADLabel) + len(o.Key) + len(o.MsgID) + len(o.CorrID) + len(o.ReplyTo) + len(origin) + len(sl.ID()) + len(scope)
	buf := make([]byte, 0, n+seal.Overhead+adLen)
	buf = append(buf, SealedVersion)
	var deadline int64
	if o.Expire > 0 {
		deadline = o.At.Add(o.Expire).UnixMilli()
	}
	if o.Kind == TypeEvent {
		deadline = time.Now().UnixMilli() // its freshness (replay.go); an older node reads no deadline of an event
	}
	buf = binary.AppendUvarint(buf, uint64(o.Expire.Milliseconds()))
	buf = binary.AppendVarint(buf, deadline)
	buf = binary.AppendUvarint(buf, uint64(len(o.Header)))
	for k, vs := range o.Header {
		buf = AppendStr(buf, k)
		buf = binary.AppendUvarint(buf, uint64(len(vs)))
		for _, v := range vs {
			buf = AppendStr(buf, v)
		}
	}
	buf = append(buf, o.Body...)
	pt := len(buf)
	ad := SealAD(buf[pt+seal.Overhead:pt+seal.Overhead], o.Kind, o.Key, o.MsgID, o.CorrID, o.ReplyTo, origin, sl.ID(), scope)
	p.Body = sl.Seal(buf[:0], ad, buf[:pt])
	p.Headers[HeaderKey] = sl.ID()
	p.ContentType, p.ContentEncoding = "", ""
	return nil
}

func AppendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// SealReader reads the sealed plaintext; the first error sticks.
type SealReader struct {
	B   []byte
	Err error
}

var ErrShortSealed = errors.New("sealed content ends early")

func (r *SealReader) Uvarint() uint64 {
	if r.Err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.B)
	if n <= 0 {
		r.Err = ErrShortSealed
		return 0
	}
	r.B = r.B[n:]
	return v
}

func (r *SealReader) Varint() int64 {
	if r.Err != nil {
		return 0
	}
	v, n := binary.Varint(r.B)
	if n <= 0 {
		r.Err = ErrShortSealed
		return 0
	}
	r.B = r.B[n:]
	return v
}

func (r *SealReader) Str() string {
	n := r.Uvarint()
	if r.Err != nil {
		return ""
	}
	if n > uint64(len(r.B)) {
		r.Err = ErrShortSealed
		return ""
	}
	s := string(r.B[:n])
	r.B = r.B[n:]
	return s
}

// UnsealText is the text of a refusal sent back to a caller.
func UnsealText(node string, ue *UnsealError) string {
	return fmt.Sprintf("node %s refused the sealed request (%s): %s", node, ue.Reason, strings.TrimSpace(ue.Detail))
}
