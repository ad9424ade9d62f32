package nodecred

import (
	"context"
	"fmt"
	"time"

	"github.com/meshbox/meshbox/cache/meshdb"
)

// Rejoin gives node a new generation of its credential with a join token
// for its machine, valid for ttl, whose database URL is dbURL (the admin's)
// with the new generation's login role; then it revokes every older
// generation, at once: a machine still running with one is refused.
//
// The token is reported (Created, with Token) before the revocations, and
// returned; with a *RevokeError it is valid all the same, and a Rotate of
// the node revokes the rest once the node runs on the new generation. An unknown node gives ErrUnknownNode,
// one without a credential of its own ErrNoCredential.
func (r *Rotator) Rejoin(ctx context.Context, node, dbURL string, ttl time.Duration) (meshdb.AddedNode, error) {
	if err := r.checkNode(ctx, node); err != nil {
		return meshdb.AddedNode{}, err
	}
	targets, err := r.targets(ctx, node)
	if err != nil {
		return meshdb.AddedNode{}, err
	}
	if len(targets) == 0 {
		return meshdb.AddedNode{}, fmt.Errorf("node %q: %w", node, ErrNoCredential)
	}
	t := targets[0]
	broker, err := r.Connect(ctx)
	if err != nil {
		return meshdb.AddedNode{}, err
	}
	stages, err := r.DB.NodeStages(ctx, node)
	if err != nil {
		return meshdb.AddedNode{}, err
	}
	gen := t.newest.Generation + 1
	cred, err := broker.CreateGeneration(ctx, node, gen, stages)
	if err != nil {
		return meshdb.AddedNode{}, fmt.Errorf("node %s: %w", node, err)
	}
	added, err := r.DB.ReissueJoin(ctx, dbURL, node, brokerCredential(gen, cred), ttl)
	if err != nil {
		return meshdb.AddedNode{}, fmt.Errorf("node %s: %w", node, undoCreate(ctx, broker, node, gen, cred.User, err))
	}
	token := added.Token
	r.report(Created{Node: node, Generation: gen, User: cred.User, Role: added.Role, Revision: added.Revision, Token: &token})
	if failed := r.revoke(ctx, broker, node, append(t.older, t.newest.Generation)); len(failed) > 0 {
		return added, &RevokeError{Errs: failed}
	}
	return added, nil
}
