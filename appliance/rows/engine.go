package rows

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbox/meshbox/internal/seal"
)

// TableSpec is a table as the mesh defines it (mesh table add/bind).
type TableSpec struct {
	// Scope is the scope whose key seals the table ("": the mesh's).
	Scope string `json:"scope,omitempty"`
}

// Config configures an Engine.
type Config struct {
	Node string
	// Path is the store's file (<data>/rows.db).
	Path string
	// Keys seal and open the tables' changes; nil: this node has no
	// broker (standalone) and its tables stay on it.
	Keys *seal.Keyring
	// Link is the node's broker link, through which the sync reaches the
	// tables' logs (link.go); nil: none, the tables stay on this node.
	Link Link
	// Declare reports whether a sync logged in as broker user makes the
	// stream queues and their bindings when missing: a mesh on one broker
	// credential has no admin to make them (nil: never).
	Declare func(user string) bool
	// Retention of each table's log.
	MaxAge   time.Duration
	MaxBytes int64
	// SnapshotEvery is how many changes in a table's log since the last
	// snapshot make a node write a new one (0: DefaultSnapshotEvery).
	SnapshotEvery int
	// BinaryParts reports whether every node that may read the tables
	// reads snapshot parts in binary (binpart.go); nil or false: this
	// node writes them in JSON, as nodes of before read them.
	BinaryParts func() bool
	// MaxDrift bounds how far ahead of this node's clock a change may be
	// (0: DefaultMaxDrift).
	MaxDrift time.Duration
	Logger   *slog.Logger
	Metrics  prometheus.Registerer
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Defaults.
const (
	DefaultSnapshotEvery = 10000
	DefaultMaxAge        = 30 * 24 * time.Hour
	DefaultMaxBytes      = 1 << 30
)

// Engine is a node's tables: the store, the clock, and the sync with the
// tables' logs on the broker.
type Engine struct {
	cfg   Config
	log   *slog.Logger
	store *Store
	clock *Clock
	m     *metrics

	// own: the log messages of this node's writes not yet read back
	// (hash of the sealed body -> changes), see noteOwn.
	ownMu sync.Mutex
	own   map[[sha256.Size]byte]int

	login login     // the broker user the sync logged in as (trust.go)
	nodes meshNodes // the mesh's nodes (trust.go)

	mu       sync.Mutex
	tables   map[string]TableSpec
	linkErr  string // the last session's failure ("": none, or it ended well)
	watchers []func(Applied)
	status   map[string]*tableState

	wake      chan struct{} // cap 1: a local write waits for the broker
	snapshots chan string   // cap 4: tables to write a snapshot of
	reconf    chan struct{} // cap 1: the tables or the broker changed
	linkUp    chan struct{} // cap 1: the broker answers again (LinkUp)
	quit      chan struct{}
	done      chan struct{}  // closed when the sync ended
	clockDone chan struct{}  // closed when the snapshot clock ended
	writes    sync.WaitGroup // the API's writes in progress (api.go)

	readOnlyLogged sync.Map // tables whose refused writes were logged (api.go)
}

// tableState is what the sync knows of a table.
type tableState struct {
	offset        uint64 // next offset to read
	lastNext      uint64 // the offset after the newest seen in the log (0: none seen)
	sinceSnapshot int    // changes read since the newest snapshot
	waiting       string // what the reader waits for before it reads ("": nothing)
	snapshotAt    uint64 // where a node new to the log starts: the newest snapshot's From, else its first part (0: none seen)
	snapshotTime  time.Time
	lastSnapshot  time.Time // when this node last wrote one
	refused       map[string]int
	firstRefusal  string
	logged        map[string]bool // cause/sender pairs logged (refuse)
	// wantSnap: this node's replica may lack changes before where it
	// reads (it joined from a snapshot, or the log dropped what it had
	// not read): it applies the cells of the next whole snapshot it reads
	// (takingSnap, by snapWriter). Other nodes hold everything a snapshot
	// holds and do not apply its cells.
	wantSnap    bool
	takingSnap  string // sender/id of the snapshot being taken
	snapWriter  string
	takingSince time.Time                // when a part of it was last read
	snaps       map[string]*snapProgress // snapshots being read, by sender/id
	// verifying: the log before the snapshot this node joined from is
	// being read, to check the snapshot held it (verify.go).
	verifying  bool
	checking   bool  // the snapshot this node takes is checked: its claims are recorded (attest.go)
	unattested int   // versions a snapshot gave that the log, no longer whole, could not attest
	held       int   // changes held on disk for the future (held.go)
	heldNext   Stamp // the first held change's stamp (0: none)
	connected  bool
	gap        bool // the log no longer held what this node had not read
	// inRun: runs of the log being opened or committed; lastRun:
	// when the last one committed; snapApplied: when the verifier saw
	// the joined snapshot applied (verify.go waits for the reader).
	inRun       int
	reading     time.Time // when the reader of this session started, holding the key (zero: none)
	lastRun     time.Time
	snapApplied time.Time
	// snapshotQueued: this node waits to write one.
	snapshotQueued bool
}

// Open opens the store and starts the sync (it waits for tables and a
// broker).
func Open(cfg Config) (*Engine, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SnapshotEvery <= 0 {
		cfg.SnapshotEvery = DefaultSnapshotEvery
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	st, err := OpenStore(cfg.Path)
	if err != nil {
		return nil, err
	}
	e := &Engine{
		cfg: cfg, log: cfg.Logger.With("component", "rows"), store: st,
		clock:  NewClock(cfg.Now, cfg.MaxDrift),
		tables: map[string]TableSpec{}, status: map[string]*tableState{},
		wake: make(chan struct{}, 1), reconf: make(chan struct{}, 1), linkUp: make(chan struct{}, 1), snapshots: make(chan string, 4),
		quit: make(chan struct{}), done: make(chan struct{}), clockDone: make(chan struct{}),
	}
	e.m = newMetrics(e)
	if err := e.m.register(cfg.Metrics); err != nil {
		_ = st.Close()
		return nil, err
	}
	e.seedClock()
	go e.run()
	go e.snapshotClock()
	return e, nil
}

// seedClock moves the clock past every stamp the store holds: a node
// whose clock went back across a restart still writes newer versions.
func (e *Engine) seedClock() {
	tables, _ := e.store.Tables()
	for _, t := range tables {
		_ = e.store.Rows(t, "", func(_ string, cells map[string]Cell) bool {
			for _, c := range cells {
				if c.Node == e.cfg.Node {
					_ = e.clock.Observe(c.Stamp)
				}
			}
			return true
		})
	}
}

// Close stops the sync and closes the store.
func (e *Engine) Close() error {
	select {
	case <-e.quit:
	default:
		close(e.quit)
	}
	<-e.done
	<-e.clockDone
	e.writes.Wait()
	e.m.unregister()
	return e.store.Close()
}

// SetTables sets the mesh's tables (from the bindings).
func (e *Engine) SetTables(tables map[string]TableSpec) {
	e.mu.Lock()
	changed := !maps.Equal(e.tables, tables)
	e.tables = maps.Clone(tables)
	e.mu.Unlock()
	if changed {
		signal(e.reconf)
	}
}

// Reconnect makes the sync dial again (the broker URL or credential
// changed).
func (e *Engine) Reconnect() { signal(e.reconf) }

// LinkUp says the broker answers again (the node's bridge connected): a
// sync waiting to retry after a failure tries at once, instead of at the
// end of its backoff (up to 30 s after the broker came back).
func (e *Engine) LinkUp() { signal(e.linkUp) }

// Tables returns the mesh's tables.
func (e *Engine) Tables() map[string]TableSpec {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.tables)
}

// OnChange registers fn, called with every change applied (local writes
// and changes from the log that won), on the goroutine that applied it.
func (e *Engine) OnChange(fn func(Applied)) {
	e.mu.Lock()
	e.watchers = append(e.watchers, fn)
	e.mu.Unlock()
}

func (e *Engine) notify(a Applied) {
	e.mu.Lock()
	ws := slices.Clone(e.watchers)
	e.mu.Unlock()
	for _, w := range ws {
		w(a)
	}
}

// notifyAll counts the cells of applied (changes of the log) that won,
// and calls the watchers with each: the watchers taken once for all (a
// joiner applies rows by the hundred thousand).
func (e *Engine) notifyAll(applied []Applied) {
	if len(applied) == 0 {
		return
	}
	e.mu.Lock()
	ws := slices.Clone(e.watchers)
	e.mu.Unlock()
	n := 0
	for _, a := range applied {
		n += a.Count()
		for _, w := range ws {
			w(a)
		}
	}
	e.m.applied.Add(float64(n))
}

// Errors of the API.
var (
	ErrNoTable = errors.New("no such table")
	ErrNoKey   = errors.New("no key")
	ErrNoRow   = errors.New("no such row")
	// ErrReadOnly: a write of the API to a table the node alone writes
	// (ServeConfig.ReadOnly).
	ErrReadOnly = errors.New("table is read-only")
)

// spec returns table's spec, or ErrNoTable.
func (e *Engine) spec(table string) (TableSpec, error) {
	if err := ValidTable(table); err != nil {
		return TableSpec{}, err
	}
	e.mu.Lock()
	sp, ok := e.tables[table]
	e.mu.Unlock()
	if !ok {
		return TableSpec{}, fmt.Errorf("%w: %q (meshbox mesh table add %s makes it)", ErrNoTable, table, table)
	}
	return sp, nil
}

// Put writes fields of row (set: new values; del: fields deleted) and
// returns the write's stamp once the write is committed on this node's
// disk. The broker gets it when the link allows. It is PutMany of one.
func (e *Engine) Put(table, row string, set map[string][]byte, del []string) (Stamp, error) {
	stamps, err := e.PutMany(table, []RowWrite{{Row: row, Set: set, Delete: del}})
	if err != nil {
		return 0, err
	}
	return stamps[0], nil
}

// DeleteRow deletes every field row holds.
func (e *Engine) DeleteRow(table, row string) (Stamp, error) {
	if _, err := e.spec(table); err != nil {
		return 0, err
	}
	if err := ValidRow(row); err != nil {
		return 0, err
	}
	cells, err := e.store.Row(table, row)
	if err != nil {
		return 0, err
	}
	var del []string
	for f, c := range cells {
		if !c.Deleted {
			del = append(del, f)
		}
	}
	if len(del) == 0 {
		return 0, fmt.Errorf("%w: %s in table %s", ErrNoRow, row, table)
	}
	return e.Put(table, row, nil, del)
}

// Get returns row's cells, tombstones included; ErrNoRow when it holds
// no field that is not deleted.
func (e *Engine) Get(table, row string) (map[string]Cell, error) {
	if _, err := e.spec(table); err != nil {
		return nil, err
	}
	if err := ValidRow(row); err != nil {
		return nil, err
	}
	cells, err := e.store.Row(table, row)
	if err != nil {
		return nil, err
	}
	for _, c := range cells {
		if !c.Deleted {
			return cells, nil
		}
	}
	return nil, fmt.Errorf("%w: %s in table %s", ErrNoRow, row, table)
}

// List calls fn for each row of table (not deleted) whose key starts with
// prefix, in key order, until fn returns false.
func (e *Engine) List(table, prefix string, fn func(row string, cells map[string]Cell) bool) error {
	return e.ListAfter(table, prefix, "", fn)
}

// ListAfter is List from the first row whose key sorts after after (""
// from the first): the next page of a list that ended at after.
func (e *Engine) ListAfter(table, prefix, after string, fn func(row string, cells map[string]Cell) bool) error {
	if _, err := e.spec(table); err != nil {
		return err
	}
	if after != "" {
		if err := ValidRow(after); err != nil {
			return fmt.Errorf("after: %w", err)
		}
	}
	return e.store.RowsAfter(table, prefix, after, func(row string, cells map[string]Cell) bool {
		for _, c := range cells {
			if !c.Deleted {
				return fn(row, cells)
			}
		}
		return true
	})
}

// History returns the versions of row.field this node holds, newest first.
func (e *Engine) History(table, row, field string) ([]Cell, error) {
	if _, err := e.spec(table); err != nil {
		return nil, err
	}
	if err := ValidRow(row); err != nil {
		return nil, err
	}
	if err := ValidField(field); err != nil {
		return nil, err
	}
	return e.store.History(table, row, field)
}

// Store returns the engine's store (tests compare replicas).
func (e *Engine) Store() *Store { return e.store }

func scopeName(scope string) string {
	if scope == "" {
		return "the mesh"
	}
	return "scope " + scope
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// TableStatus is a table's part of the node's status.
type TableStatus struct {
	Table   string `json:"table"`
	Scope   string `json:"scope,omitempty"`
	Rows    int    `json:"rows"`
	Pending int    `json:"pending"` // local writes the broker has not confirmed
	// Behind is how many offsets of the table's log this node has not read
	// (as of the newest it saw).
	Behind       uint64     `json:"behind"`
	Offset       uint64     `json:"offset"`
	Synced       bool       `json:"synced"` // reading the log now
	LastSnapshot *time.Time `json:"last_snapshot,omitempty"`
	// ReadingSince is when this node began to read the table's log in
	// its current session, holding the table's key: how long ago it
	// reconnected, or how long a join has taken.
	ReadingSince *time.Time `json:"reading_since,omitempty"`
	// Refused counts changes of the log this node could not apply, by
	// cause (unopened, future, malformed); Alarm says the first in words.
	// A refusal means this replica may differ from the others.
	Refused map[string]int `json:"refused,omitempty"`
	Alarm   string         `json:"alarm,omitempty"`
	// Gap: the log no longer held changes this node had not read (it was
	// away longer than the log keeps them); it converged from the newest
	// snapshot.
	Gap bool `json:"gap,omitempty"`
	// LinkError is why this node does not read the table's log now: the
	// last failure of its link to the broker (empty while it reads).
	LinkError string `json:"link_error,omitempty"`
	// Waiting is what this node waits for before it reads the table's
	// log: a key of the table's scope it is a member of.
	Waiting string `json:"waiting,omitempty"`
	// Verifying: this node joined from a snapshot and is reading the log
	// before it, to check that the snapshot held every change there (a
	// change it lacked is applied and raises the alarm
	// snapshot_disagrees).
	Verifying bool `json:"verifying,omitempty"`
	// Held is how many changes stamped ahead of this node's clock wait on
	// its disk until the clock reaches them.
	Held int `json:"held,omitempty"`
	// Unattested is how many versions this node holds on the word of the
	// snapshot it joined from alone: they name another writer than the
	// snapshot's, and the log, which no longer starts at its beginning,
	// holds no change that made them.
	Unattested int `json:"unattested,omitempty"`
}

// Status returns every table's status.
func (e *Engine) Status() []TableStatus {
	e.mu.Lock()
	tables := maps.Clone(e.tables)
	linkErr := e.linkErr
	states := map[string]tableState{}
	for t, s := range e.status {
		c := *s
		c.refused = maps.Clone(s.refused)
		states[t] = c
	}
	e.mu.Unlock()
	var out []TableStatus
	for _, t := range slices.Sorted(maps.Keys(tables)) {
		ts := TableStatus{Table: t, Scope: tables[t].Scope}
		ts.Rows, ts.Pending, _ = e.store.Counts(t)
		if s, ok := states[t]; !ok || !s.connected {
			ts.LinkError = linkErr
		}
		if s, ok := states[t]; ok {
			ts.Offset, ts.Synced, ts.Gap, ts.Waiting = s.offset, s.connected, s.gap, s.waiting
			if s.lastNext > s.offset {
				ts.Behind = s.lastNext - s.offset
			}
			ts.Verifying, ts.Held, ts.Unattested = s.verifying, s.held, s.unattested
			if !s.reading.IsZero() {
				r := s.reading
				ts.ReadingSince = &r
			}
			if !s.snapshotTime.IsZero() {
				st := s.snapshotTime
				ts.LastSnapshot = &st
			}
			if len(s.refused) > 0 {
				ts.Refused, ts.Alarm = s.refused, s.firstRefusal
			}
		}
		out = append(out, ts)
	}
	return out
}

// state returns table's sync state (e.mu held).
func (e *Engine) state(table string) *tableState {
	s := e.status[table]
	if s == nil {
		s = &tableState{}
		e.status[table] = s
	}
	return s
}

// refuse counts a change of table's log this node cannot apply, from
// sender (a broker user or node), under cause; it logs once per table,
// cause and sender.
func (e *Engine) refuse(table, cause, sender string, err error) {
	e.refuseN(table, cause, sender, 1, err)
}

// refuseN is refuse for n changes.
func (e *Engine) refuseN(table, cause, sender string, n int, err error) {
	e.m.refused.WithLabelValues(table, cause).Add(float64(n))
	e.mu.Lock()
	s := e.state(table)
	if s.refused == nil {
		s.refused, s.logged = map[string]int{}, map[string]bool{}
	}
	s.refused[cause] += n
	if s.firstRefusal == "" {
		s.firstRefusal = cause + ": " + err.Error()
	}
	key := cause + "\x00" + sender
	first := !s.logged[key] && len(s.logged) < 1024
	if first {
		s.logged[key] = true
	}
	e.mu.Unlock()
	if first {
		e.log.Warn("a change of the table's log refused; this replica may differ from the others until it is resolved (logged once per table, cause and sender)", "table", table, "cause", cause, "sender", sender, "err", err)
	}
}

// CopyTo writes a consistent copy of the engine's store to path (Store.CopyTo).
func (e *Engine) CopyTo(path string) error { return e.store.CopyTo(path) }
