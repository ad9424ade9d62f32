package bridge

import (
	"fmt"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/internal/seal"
)

// This file keeps scopes (see the package doc, Scopes): capabilities,
// stages and topics bound to a scope are sealed with the scope's key,
// which only its member nodes hold. The keyring (Config.Keys) knows the
// bindings, this node's scopes and their keys; here the bridge refuses
// what a node outside a scope would send or host.

// expectedScope is the scope env must be sealed for. A reply carries the
// scope of its request's key (it reaches only the node that asked).
func (b *Bridge) expectedScope(env *codec.Envelope) string {
	k := codec.BindKind(env.Kind)
	if k == "" {
		return ""
	}
	return b.cfg.Keys.ScopeOf(k, env.Name)
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
		b.cfg.Node, scope, codec.KindText(kind), name, what)}
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
	if b.seen.unseal.First("host/" + stage + "/" + scope) {
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
