package keys

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
)

// The node's side of the mesh's keys (internal/seal, cache/meshdb/keys.go).
// In a mesh (a database configured) the node:
//
//   - keeps its key pair in <data>/node.key (made at its first start, mode
//     0600) and publishes the public half in its node record; likewise its
//     signing key (<data>/signing.key), with which it signs what it says
//     to the mesh (package node: signed discovery);
//   - opens its sealed copies of the mesh's content keys with its private
//     key, in memory, and hands them to the bridge's keyring: the bridge
//     seals with the newest key that every node with a public key holds
//     (during a rotation, the old one until then), opens with every key not
//     retired, and forgets a key once it retires;
//   - claims a content key nobody holds yet (makes its bytes), and seals
//     each key it holds for every node whose record has a public key and no
//     copy sealed to it. So a new node receives the keys from any running
//     node, with no admin step.
//   - does the same for the keys of each scope it is in, among the scope's
//     members only (a scope's current key is the newest every member
//     holds), and hands the keyring the scopes' bindings and this node's
//     membership (seal.Scopes); after a change of the bindings the bridge
//     re-checks which stages it may host (Bridge.ScopesChanged).
//
// A node that lacks an active key says which: Status.Lacking, the
// metric meshbox_content_key_missing{key}, and one log line per key.
//
// The node uses an opened copy only if it matches the key's commitment
// (seal.ContentKey.Commitment, published with the claim): a copy that
// does not open, is no content key, or is another key than the one its id
// names is refused (meshbox_sealed_keys_refused_total{reason}, one log
// line per copy, Status.Refused) and removed from the database, so
// that an honest holder seals the key again. A key claimed before
// commitments is taken as before and listed in Status.Uncommitted
// until a rotation (meshbox mesh key rotate, mesh scope rotate) replaces
// it.

// nodeKeyFile is the node's private key in the data directory;
// signingKeyFile its signing key.
const (
	nodeKeyFile    = "node.key"
	signingKeyFile = "signing.key"
)

// keyRetry is how soon the key keeper tries again after a database error.
const keyRetry = 2 * time.Second

// Status is the keys part of the node's status.
type Status struct {
	Sealing bool     `json:"sealing"`            // messages across the mesh are sealed
	NodeKey string   `json:"node_key,omitempty"` // fingerprint of the node's public key
	Current string   `json:"current,omitempty"`  // the content key messages are sealed with
	Held    []string `json:"held"`               // content keys this node holds (opens)
	Lacking []string `json:"lacking"`            // active content keys this node does not hold
	// Scopes are the scopes this node is in, each with the key it seals
	// with now ("": none held yet).
	Scopes map[string]string `json:"scopes,omitempty"`
	// InStep: the last look at the mesh database found nothing for this
	// node to do (its public key published, every key made, its keys
	// marked as opened, every node given the keys this node holds).
	InStep bool `json:"in_step"`
	// Refused are this node's sealed copies it refused, by key id, with
	// the reason (RefusedUnopenable, RefusedInvalid, RefusedCommitment);
	// the node removes them, and a holder seals the key again.
	Refused map[string]string `json:"refused,omitempty"`
	// Uncommitted are the keys held that have no commitment (claimed
	// before commitments): their copies cannot be checked. Rotate them.
	Uncommitted []string `json:"uncommitted,omitempty"`
}

// Reasons a node refuses a sealed copy of a content key (Status.Refused,
// meshbox_sealed_keys_refused_total{reason}).
const (
	RefusedUnopenable = "unopenable" // it does not open with this node's key
	RefusedInvalid    = "invalid"    // it opens to no content key
	RefusedCommitment = "commitment" // it opens to another key than its commitment names
)

// Config is what a Keeper needs.
type Config struct {
	Node    string        // the node's name
	DataDir string        // holds the signing key (signing.key), made at the first start
	Key     *seal.NodeKey // the node's key pair (LoadNodeKey)
	DB      *meshdb.DB    // the mesh database
	Logger  *slog.Logger
	// Registerer takes the keeper's metrics (nil: not registered).
	Registerer prometheus.Registerer
	// ConditionKey is the log attribute that ties the warning of a
	// lacking key to its condition (LacksCondition); Ended says that a
	// condition so logged has ended (nil: nobody listens).
	ConditionKey string
	Ended        func(condition string)
	Now          func() time.Time // nil: time.Now
}

// Keeper holds the node's key pair and keyring and keeps its keys in
// step with the bindings. Its methods are safe for concurrent use.
type Keeper struct {
	node string
	key  *seal.NodeKey
	sign *seal.SigningKey
	ring *seal.Keyring
	db   *meshdb.DB
	log  *slog.Logger
	now  func() time.Time

	snap   atomic.Pointer[cache.Snapshot] // the newest bindings applied
	wake   chan struct{}                  // cap 1: the bindings changed
	ctx    context.Context                // of database calls; cancelled by close
	cancel context.CancelFunc
	quit   chan struct{}
	done   chan struct{}
	closed sync.Once

	// ended says that a condition the keeper logged has ended (the lack
	// of a key): the status drops what was logged about it.
	ended        func(condition string)
	conditionKey string

	mu      sync.Mutex
	opened  map[string]openedKey // by key id
	status  Status
	logged  map[string]bool // lacking keys already logged
	missing *prometheus.GaugeVec
	// refused are the copies of the bindings applied last that this node
	// refused, by key id (sync removes them); seen every copy refused so
	// far, by key id and SHA-256 of the copy, counted and logged once.
	refused      map[string]refusedCopy
	seen         map[string]bool
	refusedTotal *prometheus.CounterVec
	uncommitLog  map[string]bool // uncommitted keys already logged
	// Key events (events.go): the counter, the key sealed with last by
	// scope ("": the mesh's), the scopes this node seals nothing with for
	// now, and the compromised keys logged.
	events      *prometheus.CounterVec
	sealing     map[string]string
	paused      map[string]bool
	compromised map[string]bool
}

// maxSeenRefused bounds the refused copies remembered as logged.
const maxSeenRefused = 1024

// refusedCopy is a sealed copy this node refused, and why.
type refusedCopy struct {
	copy   cache.SealedKey
	reason string
}

// openedKey is a content key opened from a sealed copy, kept so that the
// same copy is not opened again on every change of the bindings.
type openedKey struct {
	sum [32]byte // of the sealed copy
	key seal.ContentKey
}

// LoadNodeKey loads or makes the node's key pair in dataDir.
func LoadNodeKey(dataDir string, log *slog.Logger) (*seal.NodeKey, error) {
	file := filepath.Join(dataDir, nodeKeyFile)
	k, created, err := seal.LoadOrCreateNodeKey(file)
	if err != nil {
		return nil, err
	}
	if created {
		log.Info("made this node's key pair", "node_key", k.Fingerprint(), "file", file)
	}
	return k, nil
}

// New keeps the keys of cfg.Node, whose key pair is cfg.Key, and loads or
// makes its signing key in cfg.DataDir.
func New(cfg Config) (*Keeper, error) {
	node, dataDir, k, db, log, reg := cfg.Node, cfg.DataDir, cfg.Key, cfg.DB, cfg.Logger, cfg.Registerer
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now, ended := cfg.Now, cfg.Ended
	if now == nil {
		now = time.Now
	}
	if ended == nil {
		ended = func(string) {}
	}
	if k == nil {
		return nil, errors.New("no node key loaded")
	}
	sk, created, err := seal.LoadOrCreateSigningKey(filepath.Join(dataDir, signingKeyFile))
	if err != nil {
		return nil, err
	}
	if created {
		log.Info("made this node's signing key", "signing_key", sk.Fingerprint(), "file", filepath.Join(dataDir, signingKeyFile))
	}
	ctx, cancel := context.WithCancel(context.Background())
	kk := &Keeper{
		ctx: ctx, cancel: cancel,
		node: node, key: k, sign: sk, ring: &seal.Keyring{}, db: db, log: log, now: now,
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
		opened: map[string]openedKey{}, logged: map[string]bool{}, ended: ended, conditionKey: cfg.ConditionKey,
		refused: map[string]refusedCopy{}, seen: map[string]bool{}, uncommitLog: map[string]bool{},
		events: newEventsCounter(), sealing: map[string]string{}, paused: map[string]bool{}, compromised: map[string]bool{},
		refusedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbox_sealed_keys_refused_total",
			Help: "Sealed copies of content keys this node refused, by reason: unopenable, invalid (no content key), commitment (another key than its id names).",
		}, []string{"reason"}),
		status: Status{Sealing: true, NodeKey: k.Fingerprint(), Held: []string{}, Lacking: []string{}},
		missing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshbox_content_key_missing",
			Help: "1 for each active content key of the mesh this node does not hold (it cannot open what is sealed with it).",
		}, []string{"key"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{kk.missing, kk.refusedTotal, kk.events} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register key metrics: %w", err)
			}
		}
	}
	return kk, nil
}

// Start runs the keeper's goroutine.
func (kk *Keeper) Start() {
	go kk.run() // exits when Close closes quit
}

// Close stops the goroutine and waits for it. Call it only after Start.
func (kk *Keeper) Close() {
	kk.closed.Do(func() {
		kk.cancel()
		close(kk.quit)
	})
	<-kk.done
}

// Status returns the keys part of the status.
func (kk *Keeper) Status() Status {
	kk.mu.Lock()
	defer kk.mu.Unlock()
	st := kk.status
	st.Held, st.Lacking, st.Scopes = slices.Clone(st.Held), slices.Clone(st.Lacking), maps.Clone(st.Scopes)
	st.Refused, st.Uncommitted = maps.Clone(st.Refused), slices.Clone(st.Uncommitted)
	return st
}

// Apply opens this node's copies of the active content keys in snap and
// sets the keyring, then wakes the goroutine for the database's part.
func (kk *Keeper) Apply(snap cache.Snapshot) {
	kk.snap.Store(&snap)
	kk.mu.Lock()
	kk.status.InStep = false // until a round looks at these bindings
	kk.mu.Unlock()
	kk.applyKeys(snap)
	select {
	case kk.wake <- struct{}{}:
	default:
	}
}

func (kk *Keeper) applyKeys(snap cache.Snapshot) {
	b := snap.Bindings
	now := kk.now()
	fpr := kk.key.Fingerprint()
	kk.mu.Lock()
	defer kk.mu.Unlock()
	var keys []seal.ContentKey
	var uncommitted []string
	held := map[string]bool{}
	clear(kk.refused)
	for _, sk := range b.SealedKeys {
		ck, ok := contentKey(b, sk.ID)
		if !ok || ck.Retired(now) || sk.SealedFor != fpr || !mayHold(b, ck.Scope, kk.node) {
			continue
		}
		o, committed, ok := kk.openCopy(sk, ck)
		if !ok {
			continue
		}
		if !committed {
			uncommitted = append(uncommitted, sk.ID)
		}
		o.key.Scope = ck.Scope
		if _, had := kk.opened[sk.ID]; !had && sk.SealedBy == meshdb.KitSealedBy {
			kk.event(meshdb.KeyRecovered, "opened a content key sealed for this node with the recovery kit", "key", sk.ID, "scope", ck.Scope)
		}
		kk.noteCompromised(ck)
		kk.opened[sk.ID] = o
		keys = append(keys, o.key)
		held[sk.ID] = true
	}
	for id := range kk.opened {
		if !held[id] {
			delete(kk.opened, id) // retired, gone, or left its scope: forgotten
			kk.noteForgotten(b, id)
		}
	}
	current := chooseCurrent(b, "", held, now)
	kk.noteSealing("", current)
	sc := seal.Scopes{Current: map[string]string{}, Bindings: map[string]string{}, Member: map[string]bool{},
		Members: map[string][]string{}}
	for _, s := range b.Scopes {
		sc.Members[s.Name] = s.Members
		for _, bd := range s.Bindings {
			sc.Bindings[seal.BindingKey(bd.Kind, bd.Name)] = s.Name
		}
		if s.Member(kk.node) {
			sc.Member[s.Name] = true
			id := chooseCurrent(b, s.Name, held, now)
			kk.noteSealing(s.Name, id)
			if id != "" {
				sc.Current[s.Name] = id
			}
		}
	}
	if err := kk.ring.SetScoped(keys, current, sc); err != nil {
		kk.log.Error("content keys not applied", "err", err)
		return
	}
	var lacking []string
	for _, ck := range b.ContentKeys {
		if ck.Retired(now) || !mayHold(b, ck.Scope, kk.node) {
			kk.missing.DeleteLabelValues(ck.ID)
			continue
		}
		if held[ck.ID] {
			kk.missing.DeleteLabelValues(ck.ID)
			if kk.logged[ck.ID] {
				delete(kk.logged, ck.ID)
				kk.log.Info("this node holds the content key it lacked", "key", ck.ID, "scope", ck.Scope)
				kk.ended(LacksCondition(ck.ID))
			}
			continue
		}
		lacking = append(lacking, ck.ID)
		kk.missing.WithLabelValues(ck.ID).Set(1)
		if !kk.logged[ck.ID] {
			kk.logged[ck.ID] = true
			kk.log.Warn("this node lacks a content key of the mesh; a node holding it seals it for this node", "key", ck.ID, "scope", ck.Scope,
				kk.conditionKey, LacksCondition(ck.ID))
		}
	}
	for id := range kk.logged {
		if !slices.Contains(lacking, id) && !held[id] { // retired, or out of this node's scopes: no longer lacked
			delete(kk.logged, id)
			kk.ended(LacksCondition(id))
		}
	}
	kk.status.Current, kk.status.Held, kk.status.Lacking = current, kk.ring.IDs(), lacking
	kk.status.Uncommitted, kk.status.Refused = uncommitted, nil
	for id, rc := range kk.refused {
		if kk.status.Refused == nil {
			kk.status.Refused = map[string]string{}
		}
		kk.status.Refused[id] = rc.reason
	}
	kk.status.Scopes = nil
	if len(sc.Member) > 0 {
		kk.status.Scopes = map[string]string{}
		for name := range sc.Member {
			kk.status.Scopes[name] = sc.Current[name]
		}
	}
	if kk.status.Held == nil {
		kk.status.Held = []string{}
	}
	if kk.status.Lacking == nil {
		kk.status.Lacking = []string{}
	}
}

// LacksCondition is the condition (Config.ConditionKey) of lacking
// content key id.
func LacksCondition(id string) string { return "lacks content key " + id }

// contentKey returns content key id of b.
func contentKey(b cache.Bindings, id string) (cache.ContentKey, bool) {
	for _, ck := range b.ContentKeys {
		if ck.ID == id {
			return ck, true
		}
	}
	return cache.ContentKey{}, false
}

// mayHold reports whether node may hold the keys of scope ("": the
// mesh's, every node).
func mayHold(b cache.Bindings, scope, node string) bool {
	if scope == "" {
		return true
	}
	for _, s := range b.Scopes {
		if s.Name == scope {
			return s.Member(node)
		}
	}
	return false
}

// chooseCurrent picks the key of scope ("": the mesh's) to seal with
// among those held: the newest that every node with a public key that may
// hold it (every node, or the scope's members) holds (sealed to its key
// now) and opens messages with already (it said so: KeyHolder.Opened);
// when none is, the oldest held (the one the others are most likely to
// hold). "" when none is held.
//
// A key marked compromised (a node removed as compromised held it) is
// never chosen; and while such a key of the scope is active, neither is a
// key not every node holds yet: the node seals nothing (its writes wait)
// rather than seal under a key the removed node holds, or one a member
// cannot open yet. The wait ends when every node holds the new key, or
// when the compromised keys retire.
func chooseCurrent(b cache.Bindings, scope string, held map[string]bool, now time.Time) string {
	var active []cache.ContentKey
	compromised := false
	for _, ck := range b.ContentKeys {
		if ck.Scope != scope || ck.Retired(now) {
			continue
		}
		if ck.Compromised {
			compromised = true
			continue
		}
		if held[ck.ID] {
			active = append(active, ck)
		}
	}
	if len(active) == 0 {
		return ""
	}
	slices.SortFunc(active, func(x, y cache.ContentKey) int {
		if c := x.CreatedAt.Compare(y.CreatedAt); c != 0 {
			return c
		}
		if x.ID < y.ID {
			return -1
		}
		return 1
	})
	holders := map[string]string{} // key/node -> sealed_for, of holders that opened it
	for _, h := range b.KeyHolders {
		if h.Opened {
			holders[h.KeyID+"/"+h.Node] = h.SealedFor
		}
	}
	for i := len(active) - 1; i >= 0; i-- {
		all := true
		for _, n := range b.Nodes {
			if n.PublicKey == "" || !mayHold(b, scope, n.Name) {
				continue
			}
			if holders[active[i].ID+"/"+n.Name] != fingerprintOf(n.PublicKey) {
				all = false
				break
			}
		}
		if all {
			return active[i].ID
		}
	}
	if compromised {
		return ""
	}
	return active[0].ID
}

// fingerprintOf returns the fingerprint of a base64 public key ("" when it
// does not decode).
func fingerprintOf(pub string) string {
	raw, err := base64.StdEncoding.DecodeString(pub)
	if err != nil {
		return ""
	}
	return seal.Fingerprint(raw)
}

// OpenGrant returns the credential of grant g, opened in memory with the
// node's private key (a grant written before credentials were sealed
// returns its plain credential).
func (kk *Keeper) OpenGrant(g cache.Grant) (cache.Credential, error) {
	if g.SealedCredential == "" {
		return g.Credential, nil
	}
	sealed, err := base64.StdEncoding.DecodeString(g.SealedCredential)
	if err != nil {
		return "", fmt.Errorf("grant of %s from %s: sealed credential: %w", g.Resource, g.Provider, err)
	}
	cred, err := kk.key.Open(seal.GrantInfo(g.Consumer, g.Resource, g.Provider), sealed)
	if err != nil {
		return "", fmt.Errorf("grant of %s from %s: %w", g.Resource, g.Provider, err)
	}
	return cache.Credential(cred), nil
}

// Ring is the keyring the keeper keeps in step: the bridge and the tables
// seal and open with it.
func (kk *Keeper) Ring() *seal.Keyring { return kk.ring }

// Signer is the node's signing key: it signs what the node says to the
// mesh (package node: signed discovery).
func (kk *Keeper) Signer() *seal.SigningKey { return kk.sign }
