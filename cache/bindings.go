package cache

import (
	"bufio"
	"cmp"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"slices"
	"time"
)

// Sources of a snapshot as shown in Status.Source.
const (
	SourceDB    = "db"    // loaded from the mesh database
	SourceCache = "cache" // read from the local cache file
	SourceNone  = "none"  // no bindings at all
)

const redacted = "[redacted]"

// Bindings is what one node needs from the mesh database: every node record
// and mesh setting, but only its own assignments, overrides and grants.
// A Bindings value is not modified once it is part of a Snapshot; treat it
// as read-only.
type Bindings struct {
	Node        string            `json:"node"` // the node these bindings were loaded for
	Nodes       []NodeRecord      `json:"nodes"`
	Settings    map[string]string `json:"settings"`
	Assignments []Assignment      `json:"assignments"`
	Overrides   []Override        `json:"overrides"`
	Grants      []Grant           `json:"grants"`
	// Broker is the node's newest broker credential (nil: none recorded;
	// the node connects with the broker.url setting as it is).
	Broker *BrokerCredential `json:"broker,omitempty"`
	// Stages is the node's stage allow-list: the stages its broker users
	// may consume ("*": every stage; empty: none). Nil in bindings read
	// from a cache file older than it, or for a node without a record.
	Stages []string `json:"stages"`
	// ContentKeys are the mesh's content keys (ids and lifetimes, never
	// their bytes); SealedKeys this node's own sealed copies of them;
	// KeyHolders who holds a copy of which key (see internal/seal).
	ContentKeys []ContentKey `json:"content_keys,omitempty"`
	SealedKeys  []SealedKey  `json:"sealed_keys,omitempty"`
	KeyHolders  []KeyHolder  `json:"key_holders,omitempty"`
	// Scopes are the mesh's scopes: smaller trust boundaries with keys of
	// their own, their members and the names bound to them.
	Scopes []Scope `json:"scopes,omitempty"`
}

// Scope is one of the mesh's scopes: the nodes that hold its keys and the
// capabilities, stages and topics whose traffic is sealed with them.
type Scope struct {
	Name     string         `json:"name"`
	Members  []string       `json:"members"`  // sorted
	Bindings []ScopeBinding `json:"bindings"` // sorted by kind, then name
}

// ScopeBinding binds a name of a kind (cap, stage, topic) to a scope.
type ScopeBinding struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
}

// Member reports whether node is in the scope.
func (s Scope) Member(node string) bool { return slices.Contains(s.Members, node) }

// ContentKey is one of the mesh's content keys: its id and lifetime.
type ContentKey struct {
	ID        string     `json:"id"`
	Scope     string     `json:"scope,omitempty"` // "": the mesh's key; else a scope's
	CreatedAt time.Time  `json:"created_at"`
	RetireAt  *time.Time `json:"retire_at,omitempty"` // after it, nodes forget the key
	// Commitment is the key's commitment (seal.ContentKey.Commitment),
	// published by the node that made its bytes: a node uses an opened
	// copy only if it matches. Empty for a key claimed before commitments.
	Commitment []byte `json:"commitment,omitempty"`
	// Compromised: a node removed as compromised held the key. No node
	// seals with it; members open with it until it retires.
	Compromised bool `json:"compromised,omitempty"`
}

// Retired reports whether the key is retired at now.
func (k ContentKey) Retired(now time.Time) bool { return k.RetireAt != nil && !now.Before(*k.RetireAt) }

// SealedKey is a copy of content key ID sealed to this node's public key
// (whose fingerprint is SealedFor). Only the node's private key opens it.
type SealedKey struct {
	ID        string `json:"id"`
	SealedFor string `json:"sealed_for"`
	Sealed    []byte `json:"sealed"`
	SealedBy  string `json:"sealed_by,omitempty"` // the node that sealed it ("": not read)
}

// KeyHolder says that Node holds a copy of content key KeyID sealed to the
// public key with fingerprint SealedFor, and whether it opens messages
// with it already.
type KeyHolder struct {
	KeyID     string `json:"key_id"`
	Node      string `json:"node"`
	SealedFor string `json:"sealed_for"`
	Opened    bool   `json:"opened"`
}

// BrokerCredential is one generation of a node's own broker credential:
// its RabbitMQ user (bridge.BrokerUser) and password. The password prints
// and logs redacted (Credential); like a grant's, it marshals to JSON as its
// real value for the cache file.
type BrokerCredential struct {
	Generation int        `json:"generation"`
	User       string     `json:"user"`
	Password   Credential `json:"password"`
	CreatedAt  time.Time  `json:"created_at"`
	// SwitchedAt is when the node recorded that it connects with this
	// generation (zero: not yet).
	SwitchedAt time.Time `json:"switched_at,omitzero"`
	// Older are the node's older generations still valid on the broker,
	// oldest first: a rotation is in progress until the admin revokes them.
	Older []int `json:"older,omitempty"`
	// DBRole and DBPassword are the database login role of this
	// generation (empty for the first generation: the node logs in with the
	// role of its join token). The password prints redacted.
	DBRole     string     `json:"db_role,omitempty"`
	DBPassword Credential `json:"db_password,omitempty"`
}

// LogValue summarises the credential without its password.
func (c BrokerCredential) LogValue() slog.Value {
	return slog.GroupValue(slog.String("user", c.User), slog.Int("generation", c.Generation),
		slog.Time("created_at", c.CreatedAt), slog.String("db_role", c.DBRole))
}

// NodeRecord is one node of the mesh.
type NodeRecord struct {
	Name       string `json:"name"`        // mesh name, the node's identity on the mesh
	PublicName string `json:"public_name"` // optional public (DNS) name
	Identity   string `json:"identity"`    // free identity text
	// PublicKey is the node's HPKE public key (internal/seal) in standard
	// base64, set by the node itself; empty until it first started.
	PublicKey string `json:"public_key,omitempty"`
	// SigningKey is the node's Ed25519 public key (internal/seal) in
	// standard base64, set by the node itself; empty until it first
	// started a version that signs. Its peers accept its discovery
	// messages only signed with it once it is set.
	SigningKey string `json:"signing_key,omitempty"`
	// Generations are the generations of the node's broker credential the
	// mesh database lists (sorted): the newest, and during a rotation the
	// older ones not yet revoked. Its peers accept its messages only from
	// these broker users (bridge.BrokerUser). Empty in bindings read from a
	// database or a cache file older than them.
	Generations []int `json:"generations,omitempty"`
}

// Assignment says that this node hosts Module at Selection.
type Assignment struct {
	Module    string `json:"module"`
	Selection string `json:"selection"`
	Autostart bool   `json:"autostart"`
}

// Override is a per-node, per-module value that beats the module's default.
type Override struct {
	Module string `json:"module"`
	Key    string `json:"key"`
	Value  string `json:"value"`
}

// Grant says that Consumer (this node) holds Resource from Provider, with
// Credential, or with SealedCredential: the credential sealed to the
// consumer's public key (seal.GrantInfo), which only the node opens, in
// memory, when it uses it.
type Grant struct {
	Consumer         string     `json:"consumer"`
	Resource         string     `json:"resource"`
	Provider         string     `json:"provider"`
	Credential       Credential `json:"credential"`
	SealedCredential string     `json:"sealed_credential,omitempty"` // standard base64
}

// Credential is a grant's secret. It prints and logs as "[redacted]"; use
// Reveal to get the value. It marshals to JSON as its real value (the cache
// file must hold it), so never JSON-encode Bindings into a log or a status.
type Credential string

// Reveal returns the secret.
func (c Credential) Reveal() string { return string(c) }

// String returns "[redacted]" (or "" for an empty credential).
func (c Credential) String() string {
	if c == "" {
		return ""
	}
	return redacted
}

// GoString returns the redacted form, so %#v does not leak the secret.
func (c Credential) GoString() string { return `cache.Credential("` + c.String() + `")` }

// LogValue implements slog.LogValuer.
func (c Credential) LogValue() slog.Value { return slog.StringValue(c.String()) }

// LogValue summarises the bindings without any value in them.
func (b Bindings) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("node", b.Node),
		slog.Int("nodes", len(b.Nodes)),
		slog.Int("settings", len(b.Settings)),
		slog.Int("assignments", len(b.Assignments)),
		slog.Int("overrides", len(b.Overrides)),
		slog.Int("grants", len(b.Grants)),
		slog.Bool("broker_credential", b.Broker != nil),
	)
}

// Normalize returns a copy of b with every list sorted by its key and nil
// collections made empty (but Stages, where nil means not known), the
// form in which bindings are hashed, stored and compared.
func (b Bindings) Normalize() Bindings {
	n := Bindings{
		Node:        b.Node,
		Nodes:       slices.Clone(b.Nodes),
		Settings:    make(map[string]string, len(b.Settings)),
		Assignments: slices.Clone(b.Assignments),
		Overrides:   slices.Clone(b.Overrides),
		Grants:      slices.Clone(b.Grants),
	}
	if b.Broker != nil {
		c := *b.Broker
		c.CreatedAt = c.CreatedAt.UTC()
		if !c.SwitchedAt.IsZero() {
			c.SwitchedAt = c.SwitchedAt.UTC()
		}
		c.Older = slices.Clone(c.Older)
		slices.Sort(c.Older)
		n.Broker = &c
	}
	for k, v := range b.Settings {
		n.Settings[k] = v
	}
	if b.Stages != nil { // nil stays nil: not known
		n.Stages = append([]string{}, b.Stages...)
		slices.Sort(n.Stages)
	}
	if n.Nodes == nil {
		n.Nodes = []NodeRecord{}
	}
	if n.Assignments == nil {
		n.Assignments = []Assignment{}
	}
	if n.Overrides == nil {
		n.Overrides = []Override{}
	}
	if n.Grants == nil {
		n.Grants = []Grant{}
	}
	n.ContentKeys = slices.Clone(b.ContentKeys)
	for i, k := range n.ContentKeys {
		n.ContentKeys[i].CreatedAt = k.CreatedAt.UTC()
		if k.RetireAt != nil {
			t := k.RetireAt.UTC()
			n.ContentKeys[i].RetireAt = &t
		}
	}
	n.SealedKeys = slices.Clone(b.SealedKeys)
	n.KeyHolders = slices.Clone(b.KeyHolders)
	for _, sc := range b.Scopes {
		c := Scope{Name: sc.Name, Members: slices.Clone(sc.Members), Bindings: slices.Clone(sc.Bindings)}
		if c.Members == nil {
			c.Members = []string{}
		}
		if c.Bindings == nil {
			c.Bindings = []ScopeBinding{}
		}
		slices.Sort(c.Members)
		slices.SortFunc(c.Bindings, func(a, b ScopeBinding) int {
			return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Name, b.Name))
		})
		n.Scopes = append(n.Scopes, c)
	}
	slices.SortFunc(n.Scopes, func(a, b Scope) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(n.ContentKeys, func(a, b ContentKey) int { return cmp.Compare(a.ID, b.ID) })
	slices.SortFunc(n.SealedKeys, func(a, b SealedKey) int { return cmp.Compare(a.ID, b.ID) })
	slices.SortFunc(n.KeyHolders, func(a, b KeyHolder) int {
		return cmp.Or(cmp.Compare(a.KeyID, b.KeyID), cmp.Compare(a.Node, b.Node))
	})
	for i, r := range n.Nodes {
		n.Nodes[i].Generations = slices.Clone(r.Generations)
		slices.Sort(n.Nodes[i].Generations)
	}
	slices.SortFunc(n.Nodes, func(a, b NodeRecord) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(n.Assignments, func(a, b Assignment) int { return cmp.Compare(a.Module, b.Module) })
	slices.SortFunc(n.Overrides, func(a, b Override) int {
		return cmp.Or(cmp.Compare(a.Module, b.Module), cmp.Compare(a.Key, b.Key))
	})
	slices.SortFunc(n.Grants, func(a, b Grant) int { return cmp.Compare(a.key(), b.key()) })
	return n
}

// Hash returns the hex SHA-256 of the normalized bindings' canonical
// encoding (credentials included, so a rotated credential changes the hash).
func (b Bindings) Hash() string { return hashNormalized(b.Normalize()) }

// hashNormalized hashes bindings already in normalized form: every field
// in a fixed order, each string length-prefixed, so no two different
// bindings share an encoding.
func hashNormalized(b Bindings) string {
	h := sha256.New()
	w := bufio.NewWriterSize(h, 32<<10)
	var num [binary.MaxVarintLen64]byte
	putN := func(n int) { w.Write(num[:binary.PutUvarint(num[:], uint64(n))]) }
	put := func(s string) { putN(len(s)); w.WriteString(s) }
	putBool := func(v bool) {
		if v {
			w.WriteByte(1)
		} else {
			w.WriteByte(0)
		}
	}
	put("meshbox bindings v1")
	put(b.Node)
	putN(len(b.Nodes))
	for _, n := range b.Nodes {
		put(n.Name)
		put(n.PublicName)
		put(n.Identity)
	}
	keys := make([]string, 0, len(b.Settings))
	for k := range b.Settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	putN(len(keys))
	for _, k := range keys {
		put(k)
		put(b.Settings[k])
	}
	putN(len(b.Assignments))
	for _, a := range b.Assignments {
		put(a.Module)
		put(a.Selection)
		putBool(a.Autostart)
	}
	putN(len(b.Overrides))
	for _, o := range b.Overrides {
		put(o.Module)
		put(o.Key)
		put(o.Value)
	}
	putN(len(b.Grants))
	for _, g := range b.Grants {
		put(g.Consumer)
		put(g.Resource)
		put(g.Provider)
		put(string(g.Credential))
	}
	// Bindings without a broker credential hash as they did before it
	// existed, so cache files written then still verify.
	if c := b.Broker; c != nil {
		put("broker credential")
		putN(c.Generation)
		put(c.User)
		put(string(c.Password))
		put(c.CreatedAt.UTC().Format(time.RFC3339Nano))
		// Rotation state, hashed only when present so that hashes of
		// credentials recorded before it stay the same.
		if !c.SwitchedAt.IsZero() || len(c.Older) > 0 || c.DBRole != "" {
			put("rotation")
			put(c.SwitchedAt.UTC().Format(time.RFC3339Nano))
			putN(len(c.Older))
			for _, g := range c.Older {
				putN(g)
			}
			put(c.DBRole)
			put(string(c.DBPassword))
		}
	}
	// Likewise keys: hashed only when there are any.
	hasKeys := len(b.ContentKeys)+len(b.SealedKeys)+len(b.KeyHolders) > 0
	for _, n := range b.Nodes {
		hasKeys = hasKeys || len(n.PublicKey) > 0
	}
	for _, g := range b.Grants {
		hasKeys = hasKeys || len(g.SealedCredential) > 0
	}
	if hasKeys {
		put("keys")
		for _, n := range b.Nodes {
			put(n.PublicKey)
		}
		for _, g := range b.Grants {
			put(g.SealedCredential)
		}
		putN(len(b.ContentKeys))
		for _, k := range b.ContentKeys {
			put(k.ID)
			put(k.CreatedAt.UTC().Format(time.RFC3339Nano))
			if k.RetireAt != nil {
				put(k.RetireAt.UTC().Format(time.RFC3339Nano))
			} else {
				put("")
			}
		}
		putN(len(b.SealedKeys))
		for _, k := range b.SealedKeys {
			put(k.ID)
			put(k.SealedFor)
			put(string(k.Sealed))
		}
		putN(len(b.KeyHolders))
		for _, h := range b.KeyHolders {
			put(h.KeyID)
			put(h.Node)
			put(h.SealedFor)
			putBool(h.Opened)
		}
	}
	// Likewise scopes, and keys' scopes.
	hasScopes := len(b.Scopes) > 0
	for _, k := range b.ContentKeys {
		hasScopes = hasScopes || k.Scope != ""
	}
	if hasScopes {
		put("scopes")
		for _, k := range b.ContentKeys {
			put(k.Scope)
		}
		putN(len(b.Scopes))
		for _, sc := range b.Scopes {
			put(sc.Name)
			putN(len(sc.Members))
			for _, m := range sc.Members {
				put(m)
			}
			putN(len(sc.Bindings))
			for _, bd := range sc.Bindings {
				put(bd.Kind)
				put(bd.Name)
			}
		}
	}
	// Likewise the nodes' credential generations.
	hasGens := false
	for _, n := range b.Nodes {
		hasGens = hasGens || len(n.Generations) > 0
	}
	if hasGens {
		put("generations")
		for _, n := range b.Nodes {
			putN(len(n.Generations))
			for _, g := range n.Generations {
				putN(g)
			}
		}
	}
	// Likewise the keys' commitments and who sealed this node's copies.
	hasCommitments := false
	for _, k := range b.ContentKeys {
		hasCommitments = hasCommitments || len(k.Commitment) > 0
	}
	for _, k := range b.SealedKeys {
		hasCommitments = hasCommitments || k.SealedBy != ""
	}
	if hasCommitments {
		put("commitments")
		for _, k := range b.ContentKeys {
			put(string(k.Commitment))
		}
		for _, k := range b.SealedKeys {
			put(k.SealedBy)
		}
	}
	// Likewise the nodes' signing keys.
	hasSigning := false
	for _, n := range b.Nodes {
		hasSigning = hasSigning || n.SigningKey != ""
	}
	if hasSigning {
		put("signing keys")
		for _, n := range b.Nodes {
			put(n.SigningKey)
		}
	}
	// Likewise the node's stage allow-list.
	if b.Stages != nil {
		put("stages")
		putN(len(b.Stages))
		for _, st := range b.Stages {
			put(st)
		}
	}
	// Likewise the keys a compromised node held.
	hasCompromised := false
	for _, k := range b.ContentKeys {
		hasCompromised = hasCompromised || k.Compromised
	}
	if hasCompromised {
		put("compromised")
		for _, k := range b.ContentKeys {
			putBool(k.Compromised)
		}
	}
	_ = w.Flush() // writes to a hash never fail
	return hex.EncodeToString(h.Sum(nil))
}

// NodeRecord returns the record of the named node and whether it exists.
func (b Bindings) NodeRecord(name string) (NodeRecord, bool) {
	for _, n := range b.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return NodeRecord{}, false
}

// SenderGenerations returns, for every node, the generations of its broker
// credential the bindings list (a node with none maps to an empty list),
// or nil when no node has any: bindings read from a database or a cache
// file older than the generations, or a mesh without broker users of its
// nodes' own.
func (b Bindings) SenderGenerations() map[string][]int {
	out := make(map[string][]int, len(b.Nodes))
	listed := false
	for _, n := range b.Nodes {
		out[n.Name] = slices.Clone(n.Generations)
		listed = listed || len(n.Generations) > 0
	}
	if !listed {
		return nil
	}
	return out
}

// SigningKeys returns the signing key of every node whose record has one
// (decoded; a key that does not decode maps to nil, which verifies
// nothing).
func (b Bindings) SigningKeys() map[string][]byte {
	out := map[string][]byte{}
	for _, n := range b.Nodes {
		if n.SigningKey == "" {
			continue
		}
		raw, err := base64.StdEncoding.DecodeString(n.SigningKey)
		if err != nil {
			raw = nil
		}
		out[n.Name] = raw
	}
	return out
}

// key identifies a grant: consumer, resource and provider.
func (g Grant) key() string { return g.Consumer + ":" + g.Resource + "@" + g.Provider }

// Snapshot is one version of a node's bindings.
type Snapshot struct {
	Revision  int64     `json:"revision"`   // the mesh revision the bindings were read at
	Hash      string    `json:"hash"`       // Bindings.Hash()
	FetchedAt time.Time `json:"fetched_at"` // when they were last read from the database
	Source    string    `json:"source"`     // where from: the redacted database address
	Bindings  Bindings  `json:"bindings"`
}

// LogValue summarises the snapshot without any value from the bindings.
func (s Snapshot) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Int64("revision", s.Revision),
		slog.String("hash", ShortHash(s.Hash)),
		slog.Time("fetched_at", s.FetchedAt),
		slog.String("source", s.Source),
	)
}

// ShortHash returns the first 12 characters of a hash, for display.
func ShortHash(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// NewSnapshot builds a snapshot of b at revision rev, normalizing b and
// computing its hash.
func NewSnapshot(rev int64, fetchedAt time.Time, source string, b Bindings) Snapshot {
	n := b.Normalize()
	return Snapshot{Revision: rev, Hash: hashNormalized(n), FetchedAt: fetchedAt.UTC(), Source: source, Bindings: n}
}
