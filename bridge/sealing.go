package bridge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
)

// This file seals what programs send across the mesh and opens it on the
// other side (Config.Keys; see the package doc, Sealing).
//
// A sealed message's body is nonce || AES-256-GCM(plaintext) || tag under
// the content key named by its Meshbox-Key header, where plaintext is
//
//	version | uvarint timeout (ms) | varint deadline (unix ms, 0: none)
//	| uvarint nkeys {str key, uvarint nvals {str val}} | body
//
// (str: a uvarint length and the bytes; an event's deadline is the time
// it was sealed, replay.go): every application header,
// Content-Type and Content-Encoding included, and the body. The associated
// data binds what routing reads and who sent it: the message type, its
// routing key (target node, capability, stage or topic), message id,
// correlation id, reply-to, the validated origin and the key id, and,
// for a key of a scope, the scope (scopes.go).

const (
	sealedVersion = 1
	sealADLabel   = "meshbox message v1"
	// maxClockSkew is how far nodes' clocks may disagree: a request is
	// refused once its sealed deadline is this far behind.
	maxClockSkew = 2 * time.Second
)

// HeaderKey names the content key a message is sealed with.
const HeaderKey = wire.HeaderKey

// Reasons a message does not open, in meshbox_unseal_failures_total and
// in the refusal.
const (
	unsealTampered   = "tampered"    // does not open: changed, or moved to another route or origin
	unsealUnknownKey = "unknown_key" // sealed with a key this node does not hold
	unsealNotSealed  = "not_sealed"  // plain, where the mesh seals
	unsealExpired    = "expired"     // a request past its sealed deadline: late or replayed
	unsealMalformed  = "malformed"   // opened, but its content is not valid
	unsealWrongScope = "wrong_scope" // a scoped name sealed with a key of another scope or the mesh's, or not a member
)

// unsealError is a message that cannot be opened. env is what routing
// could read (to answer a request, or settle a reply).
type unsealError struct {
	reason string
	detail string
	env    *envelope
	// lagging: wrong_scope, but sealed with a key of a scope this node is
	// in, for a name its bindings bind elsewhere: the sender may have read
	// a change of the scope's bindings this node has not read yet.
	lagging bool
}

func (e *unsealError) Error() string {
	return "sealed message refused (" + e.reason + "): " + e.detail
}

// asUnseal returns err as an *unsealError, or nil.
func asUnseal(err error) *unsealError {
	var ue *unsealError
	if errors.As(err, &ue) {
		return ue
	}
	return nil
}

// sealable reports whether a message of kind carries a program's content.
func sealable(kind string) bool {
	return kind == typeRequest || kind == typeReply || kind == typeCommand || kind == typeEvent
}

// sealAD appends the associated data of a message to dst. A key of a
// scope adds the scope; the mesh's keys add nothing (so messages sealed
// with them are as before scopes existed).
func sealAD(dst []byte, kind, key, msgID, corrID, replyTo, origin, keyID, scope string) []byte {
	if scope == "" {
		return seal.AssociatedData(dst, sealADLabel, kind, key, msgID, corrID, replyTo, origin, keyID)
	}
	return seal.AssociatedData(dst, sealADLabel, kind, key, msgID, corrID, replyTo, origin, keyID, scope)
}

// sealInto seals o's headers and body into p: p.Body becomes the sealed
// form, the application headers and the content properties go inside, and
// Meshbox-Key names the key. One allocation holds the plaintext (sealed in
// place) and the associated data.
func (o *outgoing) sealInto(p *amqp.Publishing, keys *seal.Keyring, origin string) error {
	scope := o.scope
	if o.kind != typeReply {
		scope = outgoingScope(keys, o.kind, o.key)
	}
	sl, err := keys.SealerFor(scope)
	if err != nil {
		if scope != "" {
			return fmt.Errorf("scope %s: %w", scope, err)
		}
		return err
	}
	n := 1 + 2*binary.MaxVarintLen64 + binary.MaxVarintLen64 + len(o.body)
	for k, vs := range o.header {
		n += len(k) + 2*binary.MaxVarintLen64
		for _, v := range vs {
			n += len(v) + binary.MaxVarintLen64
		}
	}
	adLen := 64 + len(sealADLabel) + len(o.key) + len(o.msgID) + len(o.corrID) + len(o.replyTo) + len(origin) + len(sl.ID()) + len(scope)
	buf := make([]byte, 0, n+seal.Overhead+adLen)
	buf = append(buf, sealedVersion)
	var deadline int64
	if o.expire > 0 {
		deadline = o.at.Add(o.expire).UnixMilli()
	}
	if o.kind == typeEvent {
		deadline = time.Now().UnixMilli() // its freshness (replay.go); an older node reads no deadline of an event
	}
	buf = binary.AppendUvarint(buf, uint64(o.expire.Milliseconds()))
	buf = binary.AppendVarint(buf, deadline)
	buf = binary.AppendUvarint(buf, uint64(len(o.header)))
	for k, vs := range o.header {
		buf = appendStr(buf, k)
		buf = binary.AppendUvarint(buf, uint64(len(vs)))
		for _, v := range vs {
			buf = appendStr(buf, v)
		}
	}
	buf = append(buf, o.body...)
	pt := len(buf)
	ad := sealAD(buf[pt+seal.Overhead:pt+seal.Overhead], o.kind, o.key, o.msgID, o.corrID, o.replyTo, origin, sl.ID(), scope)
	p.Body = sl.Seal(buf[:0], ad, buf[:pt])
	p.Headers[HeaderKey] = sl.ID()
	p.ContentType, p.ContentEncoding = "", ""
	return nil
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// unseal opens a sealed delivery into env: its headers, body and (for a
// request) timeout. Headers outside the seal are dropped, whatever they
// are: only the seal speaks for the sender.
func (b *Bridge) unseal(env *envelope, d *amqp.Delivery) error {
	fail := func(reason, format string, args ...any) error {
		return &unsealError{reason: reason, detail: fmt.Sprintf(format, args...), env: env}
	}
	if env.keyID == "" {
		return fail(unsealNotSealed, "a %s without %s in a mesh that seals", env.kind, HeaderKey)
	}
	// A name bound to a scope opens only with a key of that scope: no
	// downgrade to the mesh's key, no key of another scope.
	keyScope, held := b.cfg.Keys.KeyScope(env.keyID)
	// A reply is sealed as its request was; it reaches only the node that
	// asked, and its scope is in the associated data.
	if want := b.expectedScope(env); env.kind != typeReply &&
		(held && keyScope != want || !held && want != "" && !b.cfg.Keys.Member(want)) {
		err := fail(unsealWrongScope, "%s %s is bound to %s; it was sealed with key %s of %s",
			env.kind, env.name, scopeText(want), env.keyID, keyScopeText(keyScope, held, b.cfg.Node))
		err.(*unsealError).lagging = held && keyScope != "" && b.cfg.Keys.Member(keyScope)
		return err
	}
	// Opened into a buffer of its own (the sealed body stays as it came, for
	// a dead letter), which holds the associated data past the plaintext:
	// one allocation.
	n := len(d.Body)
	buf := make([]byte, n, n+64+len(sealADLabel)+len(env.kind)+len(d.RoutingKey)+len(d.MessageId)+
		len(d.CorrelationId)+len(d.ReplyTo)+len(env.origin)+len(env.keyID)+len(keyScope))
	ad := sealAD(buf[n:n], env.kind, d.RoutingKey, d.MessageId, d.CorrelationId, d.ReplyTo, env.origin, env.keyID, keyScope)
	pt, err := b.cfg.Keys.Open(buf[:0], env.keyID, ad, d.Body)
	switch {
	case errors.Is(err, seal.ErrUnknownKey):
		return fail(unsealUnknownKey, "sealed with key %s, which node %s does not hold", env.keyID, b.cfg.Node)
	case err != nil:
		return fail(unsealTampered, "does not open with key %s: changed, or moved to another route or origin", env.keyID)
	}
	if len(pt) == 0 || pt[0] != sealedVersion {
		return fail(unsealMalformed, "unknown sealed format")
	}
	r := sealReader{b: pt[1:]}
	timeout := r.uvarint()
	deadline := r.varint()
	nkeys := r.uvarint()
	var h nats.Header
	if nkeys > 0 && r.err == nil {
		if nkeys > uint64(len(r.b)) {
			return fail(unsealMalformed, "header count %d", nkeys)
		}
		h = make(nats.Header, nkeys)
	}
	size := 0
	topic := "" // a command's result topic: only the sealed one counts
	for i := uint64(0); i < nkeys && r.err == nil; i++ {
		k := r.str()
		nv := r.uvarint()
		if r.err != nil || nv > uint64(len(r.b)) {
			break
		}
		if k == HeaderResultTopic && env.kind == typeCommand && nv == 1 {
			// The one node header sealed with a command: where its result
			// goes may not be changed on the way (results.go).
			v := r.str()
			if err := names.Topic(v); r.err == nil && err != nil {
				return fail(unsealMalformed, "header %s: %v", k, err)
			}
			topic = v
			continue
		}
		if k == HeaderOrderKey && env.kind == typeCommand && nv == 1 {
			// The one program header of meshbox's own a command carries
			// sealed: its order key (commands.go).
			v := r.str()
			if r.err == nil && !wire.ValidID(v) {
				return fail(unsealMalformed, "header %s: %q is not a valid order key", k, v)
			}
			h[k] = []string{v}
			size += len(k) + len(v)
			continue
		}
		if !wire.ValidHeaderKey(k) || hasPrefixFold(k, headerPrefixMeshbox) || k == "Status" || k == "Description" {
			return fail(unsealMalformed, "header key %q is not allowed", k)
		}
		vs := make([]string, 0, nv)
		for j := uint64(0); j < nv && r.err == nil; j++ {
			v := r.str()
			if !wire.ValidHeaderValue(v) {
				return fail(unsealMalformed, "header %s has a line break", k)
			}
			size += len(k) + len(v)
			vs = append(vs, v)
		}
		h[k] = vs
	}
	if r.err != nil {
		return fail(unsealMalformed, "%v", r.err)
	}
	if size > maxHeaderBytes {
		return fail(unsealMalformed, "headers exceed %d bytes", maxHeaderBytes)
	}
	if len(r.b) > b.maxPayload() {
		return fail(unsealMalformed, "payload of %d bytes exceeds the limit of %d", len(r.b), b.maxPayload())
	}
	if env.kind == typeRequest {
		if timeout == 0 || timeout > uint64(24*time.Hour/time.Millisecond) || deadline == 0 {
			return fail(unsealMalformed, "a request without a sealed deadline")
		}
		late := time.Since(time.UnixMilli(deadline))
		if late > maxClockSkew {
			return fail(unsealExpired, "its sealed deadline passed %s ago: late or replayed", late.Round(time.Millisecond))
		}
		env.timeout = time.Duration(timeout) * time.Millisecond
	}
	if env.kind == typeEvent && deadline != 0 {
		if deadline < 0 {
			return fail(unsealMalformed, "an event sealed at %d", deadline)
		}
		env.sealedAt = time.UnixMilli(deadline)
	}
	if len(h) == 0 {
		h = nil
	}
	env.header, env.body, env.scope, env.resultTopic = h, r.b, keyScope, topic
	return nil
}

// sealReader reads the sealed plaintext; the first error sticks.
type sealReader struct {
	b   []byte
	err error
}

var errShortSealed = errors.New("sealed content ends early")

func (r *sealReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errShortSealed
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *sealReader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errShortSealed
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *sealReader) str() string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > uint64(len(r.b)) {
		r.err = errShortSealed
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// bindingLag is how long a node waits for its bindings to bind a name to
// the scope a message of it was sealed for (unsealError.lagging) before
// it refuses the message: a peer may read a change of a scope's bindings
// a moment before this node does.
const bindingLag = 2 * time.Second

// BindingLag is how long a member waits for its bindings to bind a name
// to the scope a message of it was sealed for, before it refuses it (once
// per change of its bindings, for events).
const BindingLag = bindingLag

// unsealFailed counts a refused sealed message and logs the first of each
// cause (shape and reason).
func (b *Bridge) unsealFailed(shape string, ue *unsealError) {
	b.m.unseal.WithLabelValues(shape, ue.reason).Inc()
	key := shape + "/" + ue.reason
	if ue.reason == unsealUnknownKey && ue.env != nil {
		key += "/" + ue.env.keyID
	}
	if b.seen.unseal.first(key) {
		origin := ""
		if ue.env != nil {
			origin = ue.env.origin
		}
		b.log.Warn("sealed message refused (logged once per cause; meshbox_unseal_failures_total counts them all)",
			"shape", shape, "reason", ue.reason, "origin", origin, "detail", ue.detail)
	}
}

// lacksKey explains a message this node cannot seal for want of a key.
func (b *Bridge) lacksKey(what string) error {
	return &ServiceError{Code: CodeUnavailable, Text: fmt.Sprintf(
		"node %s holds no content key to seal the %s with yet; it receives one through the mesh database", b.cfg.Node, what)}
}

// unsealText is the text of a refusal sent back to a caller.
func unsealText(node string, ue *unsealError) string {
	return fmt.Sprintf("node %s refused the sealed request (%s): %s", node, ue.reason, strings.TrimSpace(ue.detail))
}
