package nodecred

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshbox/meshbox/bridge/brokeradmin"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
)

// Broker is the broker side of the nodes' credentials: one broker user
// per node and generation. *brokeradmin.Admin is one.
type Broker interface {
	CreateGeneration(ctx context.Context, node string, gen int, stages []string) (brokeradmin.Credential, error)
	DeleteGeneration(ctx context.Context, node string, gen int) error
	DropNodeExchange(ctx context.Context, node string) error
}

// Database is the mesh database side of the nodes' credentials: their
// generations' rows and login roles. *meshdb.DB is one.
type Database interface {
	NodeExists(ctx context.Context, name string) (bool, error)
	NodeStages(ctx context.Context, name string) ([]string, error)
	CredentialGenerations(ctx context.Context, node string) ([]meshdb.CredentialGeneration, error)
	AddCredentialGeneration(ctx context.Context, node string, cred meshdb.BrokerCredential) (meshdb.Change, string, error)
	ReissueJoin(ctx context.Context, adminURL, node string, cred meshdb.BrokerCredential, ttl time.Duration) (meshdb.AddedNode, error)
	DeleteCredentialGeneration(ctx context.Context, node string, gen int) (meshdb.Change, meshdb.Revoked, error)
}

var (
	_ Broker   = (*brokeradmin.Admin)(nil)
	_ Database = (*meshdb.DB)(nil)
)

// undoTimeout bounds deleting the broker user of a generation whose
// database row could not be written.
const undoTimeout = 10 * time.Second

// A Rotator replaces the credentials of one mesh's nodes (see the package
// documentation). Its fields are set before the first call and not changed
// while one runs; it keeps nothing between calls.
type Rotator struct {
	// DB is the mesh database, connected as the admin. Required.
	DB Database
	// Connect connects to the broker's management API with the admin
	// credential. Required; see the package documentation for when it is
	// called.
	Connect func(ctx context.Context) (Broker, error)
	// Progress receives each step; nil: none are reported.
	Progress func(Event)
}

// report hands e to Progress.
func (r *Rotator) report(e Event) {
	if r.Progress != nil {
		r.Progress(e)
	}
}

// target is one node of a rotation or rejoin.
type target struct {
	node    string
	newest  meshdb.CredentialGeneration
	older   []int     // the generations before newest, still valid
	waiting time.Time // since when the node is expected to switch to newest
}

// pendingOf says what each of targets waits for.
func pendingOf(targets []*target) []Pending {
	out := make([]Pending, 0, len(targets))
	for _, t := range targets {
		out = append(out, Pending{Node: t.node, Generation: t.newest.Generation, Since: t.waiting})
	}
	return out
}

// checkNode checks that name is a node name and a node of the mesh.
func (r *Rotator) checkNode(ctx context.Context, name string) error {
	if err := cache.ValidateNodeName(name); err != nil {
		return err
	}
	ok, err := r.DB.NodeExists(ctx, name)
	if err != nil {
		return err
	}
	if !ok {
		return &unknownNodeError{nf: &meshdb.NotFoundError{What: fmt.Sprintf("node %q", name)}}
	}
	return nil
}

// targets returns the nodes with a credential (node's only, or every
// node's when node is ""), each with its newest and older generations.
func (r *Rotator) targets(ctx context.Context, node string) ([]*target, error) {
	gens, err := r.DB.CredentialGenerations(ctx, node)
	if err != nil {
		return nil, err
	}
	var out []*target
	byNode := map[string]*target{}
	for _, g := range gens { // by node, oldest first
		t := byNode[g.Node]
		if t == nil {
			t = &target{node: g.Node}
			byNode[g.Node] = t
			out = append(out, t)
		} else {
			t.older = append(t.older, t.newest.Generation)
		}
		t.newest = g
		if !g.Switched() {
			t.waiting = g.CreatedAt
		}
	}
	return out, nil
}

// brokerCredential is the database's record of a broker user made for
// generation gen.
func brokerCredential(gen int, cred brokeradmin.Credential) meshdb.BrokerCredential {
	return meshdb.BrokerCredential{Generation: gen, User: cred.User, Password: cache.Credential(cred.Password.Reveal())}
}

// undoCreate deletes the broker user of node's generation gen, whose
// database row could not be written (err), and returns err with the
// deletion's failure joined to it.
func undoCreate(ctx context.Context, b Broker, node string, gen int, user string, err error) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	if derr := b.DeleteGeneration(cctx, node, gen); derr != nil {
		err = errors.Join(err, fmt.Errorf("also failed to delete broker user %s: %w", user, derr))
	}
	return err
}

// revoke deletes the broker users of node's generations gens and then
// their rows and login roles in the database, reporting each, and returns
// what failed.
func (r *Rotator) revoke(ctx context.Context, b Broker, node string, gens []int) []error {
	var failed []error
	for _, g := range gens {
		if err := b.DeleteGeneration(ctx, node, g); err != nil {
			failed = append(failed, fmt.Errorf("node %s: revoke generation %d: %w", node, g, err))
			continue
		}
		_, rev, err := r.DB.DeleteCredentialGeneration(ctx, node, g)
		if err != nil {
			failed = append(failed, fmt.Errorf("node %s: revoke generation %d in the database: %w", node, g, err))
			continue
		}
		r.report(Revoked{Node: node, Generation: g, Database: rev})
	}
	return failed
}
