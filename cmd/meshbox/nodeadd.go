package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshbox/meshbox/bridge/brokeradmin"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
)

// addNode makes a node with its identity: the broker user (generation 1),
// allowed to consume the given stages and no other (none when stages is
// empty), through the management API, then, in one database transaction, its
// record, database role, broker credential row and join token, which it
// prints on one line. If the database step fails the broker user is
// deleted again. With kit (the mesh's recovery kit), it seals the mesh's
// keys for the node (kitKeysForNode), whose key pair then travels in its
// join token; without, the node waits for a node that holds them.
func (c *MeshCommand) addNode(ctx context.Context, db *meshdb.DB, rec cache.NodeRecord, adminURL string, o newNodeOptions) error {
	stages, ttl, kit := o.stages, o.ttl, o.kit
	out := c.m.Stdout
	if err := cache.ValidateNodeName(rec.Name); err != nil {
		return fmt.Errorf("add node: %w", err)
	}
	if err := db.CheckCanAddNodes(ctx); err != nil {
		return fmt.Errorf("add node: %w", err)
	}
	exists, identity, err := db.NodeHasIdentity(ctx, rec.Name)
	if err != nil {
		return fmt.Errorf("add node: %w", err)
	}
	if identity {
		return fmt.Errorf("add node: %w (meshbox mesh node rejoin %s gives it a new join token)", &meshdb.ExistsError{What: fmt.Sprintf("node %q", rec.Name)}, rec.Name)
	}
	if err := checkScopesExist(ctx, db, o.scopes); err != nil {
		return fmt.Errorf("add node: %w", err)
	}
	if exists {
		fmt.Fprintf(out, "node %s: recorded without a credential of its own; giving it one\n", rec.Name)
	}
	var nodeKey *seal.NodeKey
	var copies []meshdb.SealedCopy
	if kit != nil {
		if nodeKey, copies, err = kitKeysForNode(ctx, db, kit, rec.Name, o); err != nil {
			return fmt.Errorf("add node: %w", err)
		}
	}
	brokerURL, err := db.Setting(ctx, meshdb.SettingBrokerURL)
	if err != nil {
		return fmt.Errorf("add node: %w (run meshbox init first)", err)
	}
	vhost, err := brokeradmin.VhostOf(brokerURL)
	if err != nil {
		return fmt.Errorf("add node: %w", err)
	}
	admin, err := brokeradmin.Connect(ctx, adminURL, vhost, brokeradmin.Options{})
	if err != nil {
		return fmt.Errorf("add node: %w", err)
	}
	if err := admin.DeclareMesh(ctx); err != nil {
		return fmt.Errorf("add node: %w", err)
	}
	cred, err := admin.CreateGeneration(ctx, rec.Name, 1, stages)
	if err != nil {
		return fmt.Errorf("add node: %w", err)
	}
	fmt.Fprintf(out, "node %s: broker user %s created on %s (vhost %s, %s)\n",
		rec.Name, cred.User, admin.Endpoint(), vhost, describeStages(stages))
	added, err := db.AddNodeIdentity(ctx, c.dbURL, meshdb.NewNode{
		Record: rec, Stages: stages, TTL: ttl, Scopes: o.scopes,
		Broker: meshdb.BrokerCredential{Generation: cred.Generation, User: cred.User, Password: cache.Credential(cred.Password.Reveal())},
	})
	if err != nil {
		// Leave nothing behind on the broker; the database changed nothing.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if derr := admin.DeleteGeneration(cctx, rec.Name, cred.Generation); derr != nil {
			err = errors.Join(err, fmt.Errorf("also failed to delete broker user %s: %w", cred.User, derr))
		}
		return fmt.Errorf("add node: %w", err)
	}
	fmt.Fprintf(out, "node %s: database role %s created, node recorded (mesh revision %d)\n", rec.Name, added.Role, added.Revision)
	if len(o.scopes) > 0 {
		fmt.Fprintf(out, "node %s: member of scopes %s\n", rec.Name, strings.Join(o.scopes, ","))
	}
	if kit != nil {
		if _, err := db.SealForNewNode(ctx, rec.Name, nodeKey.Public(), copies); err != nil {
			return fmt.Errorf("add node: the node is recorded, but its keys are not sealed: %w (meshbox mesh node remove %s --force, then add it again)", err, rec.Name)
		}
		text, err := nodeKey.MarshalText()
		if err != nil {
			return fmt.Errorf("add node: %w", err)
		}
		added.Token.NodeKey = string(text)
		ids := make([]string, len(copies))
		for i, k := range copies {
			ids[i] = k.ID
		}
		fmt.Fprintf(out, "node %s: content keys opened with the recovery kit and sealed for it: %s; it opens them from its first start (its key pair is in the join token: keep the token secret)\n",
			rec.Name, listOrNone(ids))
		if len(o.lostKeys) > 0 {
			fmt.Fprintf(out, "node %s: content keys given up as lost (the kit has no copy): %s; what was sealed with them cannot be opened\n",
				rec.Name, strings.Join(o.lostKeys, ","))
		}
	} else {
		fmt.Fprintf(out, "node %s: waits for a node that holds the mesh's keys to seal them for it (or add it with --kit)\n", rec.Name)
	}
	fmt.Fprintf(out, "join token for node %s (one use, expires %s); on the new machine run: meshbox join TOKEN\n",
		rec.Name, added.Token.Expires.UTC().Format(time.RFC3339))
	fmt.Fprintln(out, added.Token.Encode())
	return nil
}

// newNodeOptions are what `mesh node add` gives a node besides its
// record.
type newNodeOptions struct {
	stages []string      // the stages it may consume
	scopes []string      // the scopes it is a member of
	ttl    time.Duration // of its join token
	kit    *seal.Kit     // nil: its keys are sealed by a node that holds them
	// lostKeys are content keys the kit has no copy of and no node that
	// holds them is left: the node is added without them.
	lostKeys []string
}

// checkScopesExist refuses a scope the mesh does not have.
func checkScopesExist(ctx context.Context, db *meshdb.DB, scopes []string) error {
	if len(scopes) == 0 {
		return nil
	}
	have, err := db.Scopes(ctx)
	if err != nil {
		return err
	}
	for _, s := range scopes {
		if !slices.ContainsFunc(have, func(h cache.Scope) bool { return h.Name == s }) {
			return fmt.Errorf("the mesh has no scope %q: meshbox mesh scope list shows its scopes (nothing was changed)", s)
		}
	}
	return nil
}

// describeStages says which stages an allow-list lets a node consume.
func describeStages(stages []string) string {
	switch {
	case len(stages) == 0:
		return "no stage: give --stages, or later mesh node set-stages, for the stages it may consume"
	case slices.Contains(stages, wire.AllStages):
		return "every stage"
	}
	return "stages " + strings.Join(stages, ",")
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
