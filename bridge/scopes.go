package bridge

import (
	"fmt"
	"strings"

	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
)

// This file keeps scopes (see the package doc, Scopes): capabilities,
// stages and topics bound to a scope are sealed with the scope's key,
// which only its member nodes hold. The keyring (Config.Keys) knows the
// bindings, this node's scopes and their keys; here the bridge refuses
// what a node outside a scope would send or host.

// bindKind is the kind of name (seal.BindCap, BindStage, BindTopic) a
// message of kind carries ("": none, a reply or a system message).
func bindKind(kind string) string {
	switch kind {
	case typeRequest:
		return seal.BindCap
	case typeCommand:
		return seal.BindStage
	case typeEvent:
		return seal.BindTopic
	}
	return ""
}

// outgoingScope is the scope a message of kind with routing key key is
// sealed for ("": the mesh's).
func outgoingScope(keys *seal.Keyring, kind, key string) string {
	var name string
	switch kind {
	case typeRequest:
		_, name, _ = parseRequestKey(key)
	case typeCommand:
		name = strings.TrimPrefix(key, wire.CmdPrefix)
	case typeEvent:
		name = strings.TrimPrefix(key, wire.EvtPrefix)
	default:
		return ""
	}
	return keys.ScopeOf(bindKind(kind), name)
}

// expectedScope is the scope env must be sealed for. A reply carries the
// scope of its request's key (it reaches only the node that asked).
func (b *Bridge) expectedScope(env *envelope) string {
	k := bindKind(env.kind)
	if k == "" {
		return ""
	}
	return b.cfg.Keys.ScopeOf(k, env.name)
}

// scopeText names a scope in a refusal.
func scopeText(scope string) string {
	if scope == "" {
		return "no scope (the mesh's key)"
	}
	return "scope " + scope
}

// keyScopeText names the scope of a key in a refusal.
func keyScopeText(scope string, held bool, node string) string {
	switch {
	case !held:
		return "a scope node " + node + " is not in"
	case scope == "":
		return "the mesh (no scope)"
	}
	return "scope " + scope
}

// notInScope is the refusal of what this node may not do with a name of
// kind bound to a scope it is not in; nil when it may. what says what
// was tried ("submit to", "call", "publish to").
func (b *Bridge) notInScope(kind, name, what string) error {
	if b.cfg.Keys == nil {
		return nil
	}
	scope := b.cfg.Keys.ScopeOf(kind, name)
	if b.cfg.Keys.Member(scope) {
		return nil
	}
	b.m.scopeRefused.WithLabelValues(kind).Inc()
	return &ServiceError{Code: CodeForbidden, Text: fmt.Sprintf(
		"node %s is not in scope %s, to which %s %s is bound: it cannot %s it (only the scope's nodes hold its key)",
		b.cfg.Node, scope, kindText(kind), name, what)}
}

func kindText(kind string) string {
	if kind == seal.BindCap {
		return "capability"
	}
	return kind
}

// mayHost reports whether this node may host stage: a stage bound to a
// scope only on the scope's nodes. The first refusal of each stage is
// logged.
func (b *Bridge) mayHost(stage string) bool {
	if b.cfg.Keys == nil {
		return true
	}
	scope := b.cfg.Keys.ScopeOf(seal.BindStage, stage)
	if b.cfg.Keys.Member(scope) {
		return true
	}
	if b.seen.unseal.first("host/" + stage + "/" + scope) {
		b.log.Warn("a local program serves a stage of a scope this node is not in; the node does not consume its queue",
			"stage", stage, "scope", scope)
	}
	return false
}

// inScopeOf reports whether node is in the scope name of kind is bound
// to (true for a name bound to none): a capability bound to a scope is
// called only on the scope's nodes, wherever else a program serves it.
func (b *Bridge) inScopeOf(kind, name, node string) bool {
	if b.cfg.Keys == nil {
		return true
	}
	return b.cfg.Keys.InScope(b.cfg.Keys.ScopeOf(kind, name), node)
}

// ScopesChanged tells the bridge that the scopes in its keyring changed
// (their bindings or this node's membership): it consumes the stages it
// may host now, and stops consuming those it may no longer host.
func (b *Bridge) ScopesChanged() {
	signal(b.route.stagesChanged)
}
