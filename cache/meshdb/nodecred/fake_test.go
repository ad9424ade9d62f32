package nodecred_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/brokeradmin"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/cache/meshdb/nodecred"
	"github.com/meshbox/meshbox/internal/wire"
)

// fakeNode is a node in fakeDB.
type fakeNode struct {
	stages []string
	hasKey bool // it published its public key
	gens   []meshdb.CredentialGeneration
	// switchAfter: the node switches to a generation this long after it
	// was made; 0: never.
	switchAfter time.Duration
}

// fakeDB is the mesh database of the tests: nodes and their credential
// generations in memory. A node switches by itself (switchAfter), by the
// clock, so tests run it in a synctest bubble.
type fakeDB struct {
	nodes    map[string]*fakeNode
	revision int64
	reads    int // calls of CredentialGenerations

	failRead   map[int]error    // CredentialGenerations call (1-based) → its error
	failAdd    error            // of AddCredentialGeneration and ReissueJoin
	onAdd      func()           // called by AddCredentialGeneration and ReissueJoin before they fail with failAdd
	failDelete map[string]error // "node/gen" → error of DeleteCredentialGeneration
	failStages error            // of NodeStages
}

func newFakeDB() *fakeDB {
	return &fakeDB{nodes: map[string]*fakeNode{}, failRead: map[int]error{}, failDelete: map[string]error{}}
}

// add records node with generations gens (oldest first), all switched
// and made an hour ago; a node without gens has no credential.
func (db *fakeDB) add(name string, n *fakeNode, gens ...int) {
	for _, g := range gens {
		made := time.Now().Add(-time.Hour)
		n.gens = append(n.gens, meshdb.CredentialGeneration{Node: name, Generation: g, User: wire.BrokerUser(name, g), CreatedAt: made, SwitchedAt: made})
	}
	db.nodes[name] = n
}

func (db *fakeDB) generations(node string) []int {
	var out []int
	for _, g := range db.nodes[node].gens {
		out = append(out, g.Generation)
	}
	return out
}

func (db *fakeDB) NodeExists(_ context.Context, name string) (bool, error) {
	return db.nodes[name] != nil, nil
}

func (db *fakeDB) NodeStages(_ context.Context, name string) ([]string, error) {
	if db.failStages != nil {
		return nil, db.failStages
	}
	n := db.nodes[name]
	if n == nil {
		return nil, fmt.Errorf("node stages: %w", &meshdb.NotFoundError{What: fmt.Sprintf("node %q", name)})
	}
	return n.stages, nil
}

func (db *fakeDB) CredentialGenerations(_ context.Context, node string) ([]meshdb.CredentialGeneration, error) {
	db.reads++
	if err := db.failRead[db.reads]; err != nil {
		return nil, err
	}
	names := make([]string, 0, len(db.nodes))
	for name := range db.nodes {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []meshdb.CredentialGeneration
	for _, name := range names {
		if node != "" && name != node {
			continue
		}
		n := db.nodes[name]
		for i := range n.gens {
			g := &n.gens[i]
			if !g.Switched() && n.switchAfter > 0 && time.Since(g.CreatedAt) >= n.switchAfter {
				g.SwitchedAt = g.CreatedAt.Add(n.switchAfter)
			}
			out = append(out, *g)
		}
	}
	return out, nil
}

// addGeneration records generation cred of node, or fails as the real
// database does.
func (db *fakeDB) addGeneration(node string, cred meshdb.BrokerCredential) (string, error) {
	if db.failAdd != nil {
		if db.onAdd != nil {
			db.onAdd()
		}
		return "", db.failAdd
	}
	n := db.nodes[node]
	if n == nil {
		return "", &meshdb.NotFoundError{What: fmt.Sprintf("node %q", node)}
	}
	if len(n.gens) > 0 && n.gens[len(n.gens)-1].Generation >= cred.Generation {
		return "", &meshdb.ExistsError{What: fmt.Sprintf("generation %d", cred.Generation)}
	}
	if cred.User != wire.BrokerUser(node, cred.Generation) || cred.Password.Reveal() == "" {
		return "", fmt.Errorf("add generation: credential %+v is not the broker user's", cred)
	}
	n.gens = append(n.gens, meshdb.CredentialGeneration{Node: node, Generation: cred.Generation, User: cred.User, CreatedAt: time.Now()})
	db.revision++
	return fmt.Sprintf("role_%s_%d", node, cred.Generation), nil
}

func (db *fakeDB) AddCredentialGeneration(_ context.Context, node string, cred meshdb.BrokerCredential) (meshdb.Change, string, error) {
	if n := db.nodes[node]; n != nil && !n.hasKey && db.failAdd == nil {
		return meshdb.Change{}, "", fmt.Errorf("add credential generation: %w", meshdb.ErrNoPublicKey)
	}
	role, err := db.addGeneration(node, cred)
	if err != nil {
		return meshdb.Change{}, "", err
	}
	return meshdb.Change{Revision: db.revision, Changed: true}, role, nil
}

func (db *fakeDB) ReissueJoin(_ context.Context, adminURL, node string, cred meshdb.BrokerCredential, ttl time.Duration) (meshdb.AddedNode, error) {
	role, err := db.addGeneration(node, cred)
	if err != nil {
		return meshdb.AddedNode{}, err
	}
	return meshdb.AddedNode{
		Change: meshdb.Change{Revision: db.revision, Changed: true},
		Role:   role,
		Token:  meshdb.JoinToken{DB: adminURL, Node: node, ID: "t1", Secret: "s1", Expires: time.Now().Add(ttl)},
	}, nil
}

func (db *fakeDB) DeleteCredentialGeneration(_ context.Context, node string, gen int) (meshdb.Change, meshdb.Revoked, error) {
	if err := db.failDelete[fmt.Sprintf("%s/%d", node, gen)]; err != nil {
		return meshdb.Change{}, meshdb.Revoked{}, err
	}
	n := db.nodes[node]
	n.gens = slices.DeleteFunc(n.gens, func(g meshdb.CredentialGeneration) bool { return g.Generation == gen })
	db.revision++
	return meshdb.Change{Revision: db.revision, Changed: true}, meshdb.Revoked{Roles: []string{fmt.Sprintf("role_%s_%d", node, gen)}}, nil
}

// fakeBroker is the broker of the tests: the broker users that exist.
type fakeBroker struct {
	users   map[string][]int // node → generations with a broker user
	dropped []string         // nodes whose old exchange was dropped

	failCreate error
	failDelete map[string]error // "node/gen" → error of DeleteGeneration
	failDrop   error
}

func newFakeBroker() *fakeBroker {
	return &fakeBroker{users: map[string][]int{}, failDelete: map[string]error{}}
}

func (b *fakeBroker) CreateGeneration(ctx context.Context, node string, gen int, _ []string) (brokeradmin.Credential, error) {
	if err := ctx.Err(); err != nil {
		return brokeradmin.Credential{}, err
	}
	if b.failCreate != nil {
		return brokeradmin.Credential{}, b.failCreate
	}
	b.users[node] = append(b.users[node], gen)
	return brokeradmin.Credential{Node: node, Generation: gen, User: wire.BrokerUser(node, gen), Password: "secret"}, nil
}

func (b *fakeBroker) DeleteGeneration(ctx context.Context, node string, gen int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := b.failDelete[fmt.Sprintf("%s/%d", node, gen)]; err != nil {
		return err
	}
	b.users[node] = slices.DeleteFunc(b.users[node], func(g int) bool { return g == gen })
	return nil
}

func (b *fakeBroker) DropNodeExchange(ctx context.Context, node string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.failDrop != nil {
		return b.failDrop
	}
	b.dropped = append(b.dropped, node)
	return nil
}

// mesh is a Rotator on a fakeDB and a fakeBroker that records its steps.
type mesh struct {
	db       *fakeDB
	broker   *fakeBroker
	r        *nodecred.Rotator
	start    time.Time // when the mesh was made: the steps' times are since then
	steps    []string
	connects int
}

// newMesh returns a mesh without nodes; the test adds them with
// m.node, and runs in a synctest bubble when time matters.
func newMesh(tb testing.TB) *mesh {
	tb.Helper()
	m := &mesh{db: newFakeDB(), broker: newFakeBroker(), start: time.Now()}
	m.r = &nodecred.Rotator{
		DB: m.db,
		Connect: func(context.Context) (nodecred.Broker, error) {
			m.connects++
			return m.broker, nil
		},
		Progress: func(e nodecred.Event) { m.steps = append(m.steps, m.describe(e)) },
	}
	return m
}

// node adds a node with a public key and a broker user for each of gens.
func (m *mesh) node(name string, switchAfter time.Duration, gens ...int) *fakeNode {
	n := &fakeNode{hasKey: true, switchAfter: switchAfter, stages: []string{"thumbs"}}
	m.db.add(name, n, gens...)
	m.broker.users[name] = slices.Clone(gens)
	return n
}

// since says when t is, relative to the mesh's start.
func (m *mesh) since(t time.Time) string { return "+" + t.Sub(m.start).String() }

// describe writes one step on one line.
func (m *mesh) describe(e nodecred.Event) string {
	switch e := e.(type) {
	case nodecred.Skipped:
		return "skip " + e.Node
	case nodecred.Resumed:
		return fmt.Sprintf("resume %s g%d (%s) older %v", e.Node, e.Generation, e.User, e.Older)
	case nodecred.Created:
		s := fmt.Sprintf("create %s g%d (%s, %s) rev %d", e.Node, e.Generation, e.User, e.Role, e.Revision)
		if e.Token != nil {
			s += fmt.Sprintf(" token %s expires %s", e.Token.ID, m.since(e.Token.Expires))
		}
		return s
	case nodecred.NotRotated:
		return fmt.Sprintf("not rotated %s: %v", e.Node, e.Err)
	case nodecred.ReadError:
		return fmt.Sprintf("read error: %v", e.Err)
	case nodecred.Switched:
		return fmt.Sprintf("switched %s g%d at %s", e.Node, e.Generation, m.since(e.At))
	case nodecred.Waiting:
		var parts []string
		for _, p := range e.Nodes {
			parts = append(parts, fmt.Sprintf("%s g%d since %s", p.Node, p.Generation, m.since(p.Since)))
		}
		return fmt.Sprintf("waiting at %s for %s, %s left", m.since(e.At), strings.Join(parts, ", "), e.Left)
	case nodecred.Forced:
		return fmt.Sprintf("force %s g%d", e.Node, e.Generation)
	case nodecred.Revoked:
		return fmt.Sprintf("revoke %s g%d roles %v", e.Node, e.Generation, e.Database.Roles)
	}
	return fmt.Sprintf("unknown event %T", e)
}

// wantSteps checks the steps reported so far.
func (m *mesh) wantSteps(tb testing.TB, want ...string) {
	tb.Helper()
	if !slices.Equal(m.steps, want) {
		tb.Errorf("steps:\n  got  %s\n  want %s", strings.Join(m.steps, "\n       "), strings.Join(want, "\n       "))
	}
}

// wantUsers checks node's broker users and database generations.
func (m *mesh) wantUsers(tb testing.TB, node string, want ...int) {
	tb.Helper()
	if got := m.broker.users[node]; !slices.Equal(got, want) {
		tb.Errorf("%s's broker users: got %v, want %v", node, got, want)
	}
	if got := m.db.generations(node); !slices.Equal(got, want) {
		tb.Errorf("%s's generations in the database: got %v, want %v", node, got, want)
	}
}

var errBoom = errors.New("boom")
