package codec

import (
	"strings"

	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
)

// BindKind is the kind of name (seal.BindCap, BindStage, BindTopic) a
// message of kind carries ("": none, a reply or a system message).
func BindKind(kind string) string {
	switch kind {
	case TypeRequest:
		return seal.BindCap
	case TypeCommand:
		return seal.BindStage
	case TypeEvent:
		return seal.BindTopic
	}
	return ""
}

// OutgoingScope is the scope a message of kind with routing key key is
// sealed for ("": the mesh's).
func OutgoingScope(keys *seal.Keyring, kind, key string) string {
	var name string
	switch kind {
	case TypeRequest:
		_, name, _ = ParseRequestKey(key)
	case TypeCommand:
		name = strings.TrimPrefix(key, wire.CmdPrefix)
	case TypeEvent:
		name = strings.TrimPrefix(key, wire.EvtPrefix)
	default:
		return ""
	}
	return keys.ScopeOf(BindKind(kind), name)
}

// ScopeText names a scope in a refusal.
func ScopeText(scope string) string {
	if scope == "" {
		return "no scope (the mesh's key)"
	}
	return "scope " + scope
}

// KeyScopeText names the scope of a key in a refusal.
func KeyScopeText(scope string, held bool, node string) string {
	switch {
	case !held:
		return "a scope node " + node + " is not in"
	case scope == "":
		return "the mesh (no scope)"
	}
	return "scope " + scope
}

func KindText(kind string) string {
	if kind == seal.BindCap {
		return "capability"
	}
	return kind
}
