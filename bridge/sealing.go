package bridge

import (
	"errors"
	"fmt"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

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

// unseal opens a sealed delivery into env: its headers, body and (for a
// request) timeout. Headers outside the seal are dropped, whatever they
// are: only the seal speaks for the sender.
func (b *Bridge) unseal(env *codec.Envelope, d *amqp.Delivery) error {
	fail := func(reason, format string, args ...any) error {
		return &codec.UnsealError{Reason: reason, Detail: fmt.Sprintf(format, args...), Env: env}
	}
	if env.KeyID == "" {
		return fail(codec.UnsealNotSealed, "a %s without %s in a mesh that seals", env.Kind, codec.HeaderKey)
	}
	// A name bound to a scope opens only with a key of that scope: no
	// downgrade to the mesh's key, no key of another scope.
	keyScope, held := b.cfg.Keys.KeyScope(env.KeyID)
	// A reply is sealed as its request was; it reaches only the node that
	// asked, and its scope is in the associated data.
	if want := b.expectedScope(env); env.Kind != codec.TypeReply &&
		(held && keyScope != want || !held && want != "" && !b.cfg.Keys.Member(want)) {
		err := fail(codec.UnsealWrongScope, "%s %s is bound to %s; it was sealed with key %s of %s",
			env.Kind, env.Name, codec.ScopeText(want), env.KeyID, codec.KeyScopeText(keyScope, held, b.cfg.Node))
		err.(*codec.UnsealError).Lagging = held && keyScope != "" && b.cfg.Keys.Member(keyScope)
		return err
	}
	// Opened into a buffer of its own (the sealed body stays as it came, for
	// a dead letter), which holds the associated data past the plaintext:
	// one allocation.
	n := len(d.Body)
	buf := make([]byte, n, n+64+len(codec.SealADLabel)+len(env.Kind)+len(d.RoutingKey)+len(d.MessageId)+
		len(d.CorrelationId)+len(d.ReplyTo)+len(env.Origin)+len(env.KeyID)+len(keyScope))
	ad := codec.SealAD(buf[n:n], env.Kind, d.RoutingKey, d.MessageId, d.CorrelationId, d.ReplyTo, env.Origin, env.KeyID, keyScope)
	pt, err := b.cfg.Keys.Open(buf[:0], env.KeyID, ad, d.Body)
	switch {
	case errors.Is(err, seal.ErrUnknownKey):
		return fail(codec.UnsealUnknownKey, "sealed with key %s, which node %s does not hold", env.KeyID, b.cfg.Node)
	case err != nil:
		return fail(codec.UnsealTampered, "does not open with key %s: changed, or moved to another route or origin", env.KeyID)
	}
	if len(pt) == 0 || pt[0] != codec.SealedVersion {
		return fail(codec.UnsealMalformed, "unknown sealed format")
	}
	r := codec.SealReader{B: pt[1:]}
	timeout := r.Uvarint()
	deadline := r.Varint()
	nkeys := r.Uvarint()
	var h nats.Header
	if nkeys > 0 && r.Err == nil {
		if nkeys > uint64(len(r.B)) {
			return fail(codec.UnsealMalformed, "header count %d", nkeys)
		}
		h = make(nats.Header, nkeys)
	}
	size := 0
	topic := "" // a command's result topic: only the sealed one counts
	for i := uint64(0); i < nkeys && r.Err == nil; i++ {
		k := r.Str()
		nv := r.Uvarint()
		if r.Err != nil || nv > uint64(len(r.B)) {
			break
		}
		if k == codec.HeaderResultTopic && env.Kind == codec.TypeCommand && nv == 1 {
			// The one node header sealed with a command: where its result
			// goes may not be changed on the way (results.go).
			v := r.Str()
			if err := names.Topic(v); r.Err == nil && err != nil {
				return fail(codec.UnsealMalformed, "header %s: %v", k, err)
			}
			topic = v
			continue
		}
		if k == codec.HeaderOrderKey && env.Kind == codec.TypeCommand && nv == 1 {
			// The one program header of meshbox's own a command carries
			// sealed: its order key (commands.go).
			v := r.Str()
			if r.Err == nil && !wire.ValidID(v) {
				return fail(codec.UnsealMalformed, "header %s: %q is not a valid order key", k, v)
			}
			h[k] = []string{v}
			size += len(k) + len(v)
			continue
		}
		if !wire.ValidHeaderKey(k) || codec.HasPrefixFold(k, codec.HeaderPrefixMeshbox) || k == "Status" || k == "Description" {
			return fail(codec.UnsealMalformed, "header key %q is not allowed", k)
		}
		vs := make([]string, 0, nv)
		for j := uint64(0); j < nv && r.Err == nil; j++ {
			v := r.Str()
			if !wire.ValidHeaderValue(v) {
				return fail(codec.UnsealMalformed, "header %s has a line break", k)
			}
			size += len(k) + len(v)
			vs = append(vs, v)
		}
		h[k] = vs
	}
	if r.Err != nil {
		return fail(codec.UnsealMalformed, "%v", r.Err)
	}
	if size > codec.MaxHeaderBytes {
		return fail(codec.UnsealMalformed, "headers exceed %d bytes", codec.MaxHeaderBytes)
	}
	if len(r.B) > b.maxPayload() {
		return fail(codec.UnsealMalformed, "payload of %d bytes exceeds the limit of %d", len(r.B), b.maxPayload())
	}
	if env.Kind == codec.TypeRequest {
		if timeout == 0 || timeout > uint64(24*time.Hour/time.Millisecond) || deadline == 0 {
			return fail(codec.UnsealMalformed, "a request without a sealed deadline")
		}
		late := time.Since(time.UnixMilli(deadline))
		if late > codec.MaxClockSkew {
			return fail(codec.UnsealExpired, "its sealed deadline passed %s ago: late or replayed", late.Round(time.Millisecond))
		}
		env.Timeout = time.Duration(timeout) * time.Millisecond
	}
	if env.Kind == codec.TypeEvent && deadline != 0 {
		if deadline < 0 {
			return fail(codec.UnsealMalformed, "an event sealed at %d", deadline)
		}
		env.SealedAt = time.UnixMilli(deadline)
	}
	if len(h) == 0 {
		h = nil
	}
	env.Header, env.Body, env.Scope, env.ResultTopic = h, r.B, keyScope, topic
	return nil
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
func (b *Bridge) unsealFailed(shape string, ue *codec.UnsealError) {
	b.m.unseal.WithLabelValues(shape, ue.Reason).Inc()
	key := shape + "/" + ue.Reason
	if ue.Reason == codec.UnsealUnknownKey && ue.Env != nil {
		key += "/" + ue.Env.KeyID
	}
	if b.seen.unseal.First(key) {
		origin := ""
		if ue.Env != nil {
			origin = ue.Env.Origin
		}
		b.log.Warn("sealed message refused (logged once per cause; meshbox_unseal_failures_total counts them all)",
			"shape", shape, "reason", ue.Reason, "origin", origin, "detail", ue.Detail)
	}
}

// lacksKey explains a message this node cannot seal for want of a key.
func (b *Bridge) lacksKey(what string) error {
	return &ServiceError{Code: CodeUnavailable, Text: fmt.Sprintf(
		"node %s holds no content key to seal the %s with yet; it receives one through the mesh database", b.cfg.Node, what)}
}
