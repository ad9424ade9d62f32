package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
)

// This file opens the mesh's keys with its recovery kit: for a new node
// (`mesh node add --kit`), and to check a kit (`mesh kit --check`).

// kitKeys are the content keys a kit opens, and those it lacks.
type kitKeys struct {
	opened []seal.ContentKey
	scope  map[string]string // key id -> its scope ("": the mesh's)
	// missing are the keys the kit has no copy of that nodes hold (made
	// or rotated since they last sealed the keys for the kit), with their
	// holders; a key nobody holds yet is in neither.
	missing map[string][]string
	waiting []string // keys nobody holds yet: the first node to see one makes it
}

// currentKit checks that kit is the current recovery kit of the mesh of
// db, and returns the mesh's id. node is the caller's node, if any.
func currentKit(ctx context.Context, db *meshdb.DB, kit *seal.Kit, node string) (string, error) {
	mesh, err := db.MeshID(ctx)
	if err != nil {
		return "", err
	}
	if kit.Mesh() != mesh {
		return "", fmt.Errorf("%w: it is the kit of mesh %s, this mesh is %s; use this mesh's kit (nothing was changed)", seal.ErrBadKit, kit.Mesh(), mesh)
	}
	pub, _, err := db.RecoveryKit(ctx, node)
	if err != nil {
		return "", err
	}
	switch {
	case pub == nil:
		return "", errors.New("this mesh has no recovery kit: make one with meshbox mesh kit; without --kit a new node waits for a node that holds the keys (nothing was changed)")
	case seal.Fingerprint(pub) != kit.Fingerprint():
		return "", fmt.Errorf("%w: %s is not the mesh's current kit (%s): it was replaced; use the newest kit (nothing was changed)", seal.ErrBadKit, kit, seal.Fingerprint(pub))
	}
	return mesh, nil
}

// openKitKeys opens with kit, the current kit of mesh, the content keys
// node may hold (the mesh's, those of the scopes it is in, and those of
// scopes). A copy that does not open, or opens to another key than the
// mesh uses, is an error.
func openKitKeys(ctx context.Context, db *meshdb.DB, kit *seal.Kit, mesh, node string, scopes []string) (kitKeys, error) {
	kk := kitKeys{scope: map[string]string{}, missing: map[string][]string{}}
	copies, err := db.KitKeysFor(ctx, node, scopes)
	if err != nil {
		return kk, err
	}
	_, holders, err := db.ContentKeys(ctx)
	if err != nil {
		return kk, err
	}
	for _, c := range copies {
		kk.scope[c.ID] = c.Scope
		if c.Sealed == nil || c.SealedFor != kit.Fingerprint() {
			for _, h := range holders {
				if h.KeyID == c.ID {
					kk.missing[c.ID] = append(kk.missing[c.ID], h.Node)
				}
			}
			if len(kk.missing[c.ID]) == 0 {
				kk.waiting = append(kk.waiting, c.ID)
			}
			continue
		}
		raw, err := kit.Open(seal.KitKeyInfo(c.ID, mesh), c.Sealed)
		if err != nil {
			return kk, fmt.Errorf("%w: its copy of content key %s does not open with it: %v (nothing was changed)", seal.ErrBadKit, c.ID, err)
		}
		k, err := seal.ContentKeyFrom(c.ID, raw)
		if err == nil && len(c.Commitment) > 0 {
			err = k.CheckCommitment(c.Commitment)
		}
		if err != nil {
			return kk, fmt.Errorf("the kit's copy of content key %s is not the key the mesh uses: %v; a node that holds it seals it again once its copy is removed (nothing was changed)", c.ID, err)
		}
		kk.opened = append(kk.opened, k)
	}
	return kk, nil
}

// kitKeysForNode opens with kit the content keys node may hold (the
// mesh's, and those of o.scopes, which it joins as it is added) and seals
// them to a new key pair for it: the node key goes into its join token,
// the copies into the mesh database (meshdb.SealForNewNode). It checks
// everything before the node is made: a kit of another mesh, one the mesh
// replaced, and one whose copies of a key held by nodes are missing are
// errors, and nothing is changed. A missing copy is no error for a key
// the admin gave up as lost (o.lostKeys: no node that holds it is left);
// naming a key the kit opens, or none the node may hold, is.
func kitKeysForNode(ctx context.Context, db *meshdb.DB, kit *seal.Kit, node string, o newNodeOptions) (*seal.NodeKey, []meshdb.SealedCopy, error) {
	mesh, err := currentKit(ctx, db, kit, node)
	if err != nil {
		return nil, nil, err
	}
	kk, err := openKitKeys(ctx, db, kit, mesh, node, o.scopes)
	if err != nil {
		return nil, nil, err
	}
	var stale, held []string
	for _, id := range slices.Sorted(maps.Keys(kk.missing)) {
		if !slices.Contains(o.lostKeys, id) {
			stale = append(stale, id)
			held = append(held, id+" (held by "+strings.Join(kk.missing[id], ",")+")")
		}
	}
	for _, id := range o.lostKeys {
		if slices.ContainsFunc(kk.opened, func(k seal.ContentKey) bool { return k.ID == id }) {
			return nil, nil, fmt.Errorf("--lost-keys %s: the recovery kit opens that key; name only keys it has no copy of (nothing was changed)", id)
		}
		if len(kk.missing[id]) == 0 {
			return nil, nil, fmt.Errorf("--lost-keys %s: not an active content key of this node's that a node holds without a copy for the kit (meshbox mesh kit --check FILE lists them; nothing was changed)", id)
		}
	}
	if len(stale) > 0 {
		return nil, nil, fmt.Errorf("the recovery kit has no copy of content key %s: made or rotated since those nodes last sealed the keys for the kit. "+
			"Start one of them and it seals it for the kit, then add the node again; if none of them is left, what was sealed with it cannot be opened: "+
			"add the node with --lost-keys %s to recover the rest (nothing was changed)", strings.Join(held, ", "), strings.Join(stale, ","))
	}
	nk, err := seal.GenerateNodeKey()
	if err != nil {
		return nil, nil, err
	}
	out := make([]meshdb.SealedCopy, 0, len(kk.opened))
	for _, k := range kk.opened {
		blob, err := seal.SealTo(nk.Public(), seal.ContentKeyInfo(k.ID, node), k.Bytes())
		if err != nil {
			return nil, nil, err
		}
		out = append(out, meshdb.SealedCopy{ID: k.ID, Sealed: blob})
	}
	return nk, out, nil
}

// checkKit checks that kit opens every active key of the mesh, the
// mesh's and every scope's, and prints a line per key: what it opens,
// what it lacks and why. A kit that lacks a key some node holds is an
// error saying what to do.
func (m *Main) checkKit(ctx context.Context, db *meshdb.DB, kit *seal.Kit) error {
	mesh, err := currentKit(ctx, db, kit, "")
	if err != nil {
		return err
	}
	scopes, err := db.Scopes(ctx)
	if err != nil {
		return err
	}
	names := make([]string, len(scopes))
	for i, s := range scopes {
		names[i] = s.Name
	}
	kk, err := openKitKeys(ctx, db, kit, mesh, "", names)
	if err != nil {
		return err
	}
	scopeOf := func(id string) string {
		if s := kk.scope[id]; s != "" {
			return "scope " + s
		}
		return "the mesh"
	}
	table := [][]string{{"KEY", "OF", "THE KIT"}}
	for _, k := range kk.opened {
		table = append(table, []string{k.ID, scopeOf(k.ID), "opens it"})
	}
	for _, id := range slices.Sorted(maps.Keys(kk.missing)) {
		table = append(table, []string{id, scopeOf(id), "has no copy: held by " + strings.Join(kk.missing[id], ",") + ", which seal it for the kit when they run"})
	}
	for _, id := range kk.waiting {
		table = append(table, []string{id, scopeOf(id), "nobody holds it yet (the first node to see it makes it)"})
	}
	if err := writeTable(m.Stdout, table); err != nil {
		return err
	}
	if len(kk.missing) > 0 {
		return fmt.Errorf("%s lacks %d keys that nodes hold: start a node that holds them, and it seals them for the kit", kit, len(kk.missing))
	}
	fmt.Fprintf(m.Stdout, "%s opens every key nodes hold (%d)\n", kit, len(kk.opened))
	return nil
}
