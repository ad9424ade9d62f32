package seal

import (
	"fmt"
	"maps"
	"slices"
)

// Kinds of names a scope binds (Scopes.Bindings).
const (
	BindCap   = "cap"   // a capability
	BindStage = "stage" // a stage
	BindTopic = "topic" // an event topic
)

// Scopes is what a keyring knows of the mesh's scopes (SetScoped): the
// key each scope seals with now, the names bound to scopes, and the scopes
// this node is in. A scope is a smaller trust boundary inside a mesh: its
// own content keys, held by its members only.
type Scopes struct {
	// Current is each scope's key to seal with, by scope; it must be one
	// of the keys, of that scope.
	Current map[string]string
	// Bindings maps BindingKey(kind, name) to the scope the name is bound
	// to. A name bound to no scope is the mesh's.
	Bindings map[string]string
	// Member says which scopes this node is in.
	Member map[string]bool
	// Members are the nodes of every scope, by scope.
	Members map[string][]string
}

// BindingKey is the key of Scopes.Bindings for name of kind (BindCap,
// BindStage, BindTopic).
func BindingKey(kind, name string) string { return kind + "/" + name }

// ScopeState is one immutable view of the scopes, held by a keyring state.
type ScopeState struct {
	current  map[string]*ringKey
	bindings map[string]string
	member   map[string]bool
	members  map[string][]string
}

func newScopeState(sc Scopes, byID map[string]*ringKey) (*ScopeState, error) {
	ss := &ScopeState{current: make(map[string]*ringKey, len(sc.Current)),
		bindings: maps.Clone(sc.Bindings), member: maps.Clone(sc.Member), members: maps.Clone(sc.Members)}
	for scope, id := range sc.Current {
		if id == "" {
			continue
		}
		k := byID[id]
		if k == nil || k.scope != scope {
			return nil, fmt.Errorf("%w: current key %s of scope %s is not among the scope's keys", ErrUnknownKey, id, scope)
		}
		ss.current[scope] = k
	}
	return ss, nil
}

// Bindings returns the scopes now in effect: another value after every
// change of the keys or the bindings, so that a caller can tell whether
// they changed since it last looked.
func (r *Keyring) Bindings() *ScopeState { return r.scopes() }

func (r *Keyring) scopes() *ScopeState {
	if st := r.state.Load(); st != nil && st.scopes != nil {
		return st.scopes
	}
	return &ScopeState{}
}

// ScopeOf returns the scope name of kind is bound to ("": the mesh's).
func (r *Keyring) ScopeOf(kind, name string) string {
	ss := r.scopes()
	if len(ss.bindings) == 0 {
		return ""
	}
	return ss.bindings[BindingKey(kind, name)]
}

// Member reports whether this node is in scope ("" , the mesh: always).
func (r *Keyring) Member(scope string) bool {
	return scope == "" || r.scopes().member[scope]
}

// InScope reports whether node is in scope ("": the mesh, every node).
func (r *Keyring) InScope(scope, node string) bool {
	return scope == "" || slices.Contains(r.scopes().members[scope], node)
}

// SealerFor returns the key to seal with now for scope ("": the mesh's,
// as Sealer): ErrNotMember when this node is not in the scope, ErrNoKey
// when it holds none of its keys yet.
func (r *Keyring) SealerFor(scope string) (*Sealer, error) {
	if scope == "" {
		return r.Sealer()
	}
	ss := r.scopes()
	if !ss.member[scope] {
		return nil, ErrNotMember
	}
	k := ss.current[scope]
	if k == nil {
		return nil, ErrNoKey
	}
	return (*Sealer)(k), nil
}

// KeyScope returns the scope of key id ("": the mesh's) and whether the
// keyring holds the key.
func (r *Keyring) KeyScope(id string) (string, bool) {
	st := r.state.Load()
	if st == nil {
		return "", false
	}
	k := st.byID[id]
	if k == nil {
		return "", false
	}
	return k.scope, true
}

// CurrentOf returns the id scope seals with now ("": none; scope "" is
// the mesh's, as Current).
func (r *Keyring) CurrentOf(scope string) string {
	if scope == "" {
		return r.Current()
	}
	if k := r.scopes().current[scope]; k != nil {
		return k.id
	}
	return ""
}
