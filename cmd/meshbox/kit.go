package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
)

// This file is the mesh's recovery kit on the command line (issue: key
// custody): `init --kit` and `mesh kit` make it, `mesh node add --kit`
// opens the keys sealed to it for a new node. Each kit event is one line
// of the command's output.

// kitNodeKeyFile is a node's private key in its data directory (as the
// key keeper names it).
const kitNodeKeyFile = "node.key"

// makeKit makes the mesh's recovery kit: it writes the kit's file to
// path (mode 0600, never over an existing file; "" writes none), stores
// its public key in the mesh database (replacing another kit only with
// replace), and prints the secret as words to write down.
func (m *Main) makeKit(ctx context.Context, db *meshdb.DB, path string, replace bool) (*seal.Kit, error) {
	mesh, err := db.MeshID(ctx)
	if err != nil {
		return nil, fmt.Errorf("recovery kit: %w", err)
	}
	kit, err := seal.NewKit(mesh)
	if err != nil {
		return nil, err
	}
	if path != "" {
		if err := writeKitFile(path, kit); err != nil {
			return nil, err
		}
	}
	if _, err := db.SetRecoveryKit(ctx, kit.Public(), replace); err != nil {
		if path != "" {
			_ = os.Remove(path) // the kit it holds is no kit of the mesh
		}
		if errors.Is(err, meshdb.ErrExists) {
			return nil, fmt.Errorf("recovery kit: the mesh has %w; --replace makes a new one (the old kit then opens no key rotated after it)", err)
		}
		return nil, fmt.Errorf("recovery kit: %w", err)
	}
	where := "not written to a file"
	if path != "" {
		where = "written to " + path + " (mode 0600)"
	}
	fmt.Fprintf(m.Stdout, "recovery kit made: %s, %s; keep it offline: it opens every key of the mesh\n", kit, where)
	fmt.Fprintf(m.Stdout, "write down its secret: mesh %s, secret %s\n", kit.Mesh(), kit.Words())
	return kit, nil
}

// writeKitFile writes kit's file to path, mode 0600, refusing an
// existing file.
func writeKitFile(path string, kit *seal.Kit) error {
	text, err := kit.MarshalText()
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("recovery kit: %s exists: a kit is never written over a file; give another --out (nothing was changed)", path)
	}
	if err != nil {
		return fmt.Errorf("recovery kit: %w", err)
	}
	if _, err := f.Write(text); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("recovery kit: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return fmt.Errorf("recovery kit: %w", err)
	}
	return nil
}

// readKit reads a kit's file.
func readKit(path string) (*seal.Kit, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("recovery kit: %w", err)
	}
	kit, err := seal.ParseKit(text)
	if err != nil {
		return nil, fmt.Errorf("recovery kit %s: %w; give the kit's file as `meshbox mesh kit` or `init --kit` wrote it", path, err)
	}
	return kit, nil
}

// sealNodeKeysForKit seals for the mesh's kit the content keys that node,
// whose data directory is dataDir, holds: it opens its copies with its
// key there. It prints the keys it sealed on one line.
func (m *Main) sealNodeKeysForKit(ctx context.Context, db *meshdb.DB, kit *seal.Kit, node, dataDir string) error {
	text, err := os.ReadFile(filepath.Join(dataDir, kitNodeKeyFile))
	if err != nil {
		return fmt.Errorf("seal keys for the kit: node %s's key: %w (give --data, the node's data directory)", node, err)
	}
	nk, err := seal.ParseNodeKey(text)
	if err != nil {
		return fmt.Errorf("seal keys for the kit: %w", err)
	}
	held, err := db.CopiesOf(ctx, node)
	if err != nil {
		return fmt.Errorf("seal keys for the kit: %w", err)
	}
	var sealed, skipped []string
	for _, sk := range held {
		raw, err := nk.Open(seal.ContentKeyInfo(sk.ID, node), sk.Sealed)
		if err != nil {
			skipped = append(skipped, sk.ID)
			continue
		}
		k, err := seal.ContentKeyFrom(sk.ID, raw)
		if err != nil || (len(sk.Commitment) > 0 && k.CheckCommitment(sk.Commitment) != nil) {
			skipped = append(skipped, sk.ID)
			continue
		}
		blob, err := seal.SealTo(kit.Public(), seal.KitKeyInfo(k.ID, kit.Mesh()), k.Bytes())
		if err != nil {
			return fmt.Errorf("seal keys for the kit: %w", err)
		}
		if _, err := db.PutKitKey(ctx, k.ID, node, kit.Fingerprint(), blob); err != nil {
			return fmt.Errorf("seal keys for the kit: %w", err)
		}
		sealed = append(sealed, k.ID)
	}
	fmt.Fprintf(m.Stdout, "content keys sealed for the recovery kit by node %s: %s\n", node, listOrNone(sealed))
	if len(skipped) > 0 {
		fmt.Fprintf(m.Stdout, "node %s's copies of %s do not open with the key in %s: running nodes that hold them seal them for the kit\n",
			node, strings.Join(skipped, ","), dataDir)
	}
	return nil
}

// listOrNone is ids joined with commas, or "none".
func listOrNone(ids []string) string {
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ",")
}

// kitKeysForNode opens with kit the content keys node may hold (the
// mesh's, and those of scopes, which it joins as it is added) and seals
// them to a new key pair for it: the node key goes into its join token,
// the copies into the mesh database (meshdb.SealForNewNode). It checks
// everything before the node is made: a kit of another mesh, one the mesh
// replaced, and one whose copies of a key held by nodes are missing are
// errors, and nothing is changed. A missing copy is no error for a key
// the admin gave up as lost (o.lostKeys: no node that holds it is left);
// naming a key the kit opens, or none the node may hold, is.
func kitKeysForNode(ctx context.Context, db *meshdb.DB, kit *seal.Kit, node string, o newNodeOptions) (*seal.NodeKey, []meshdb.SealedCopy, error) {
	mesh, err := db.MeshID(ctx)
	if err != nil {
		return nil, nil, err
	}
	if kit.Mesh() != mesh {
		return nil, nil, fmt.Errorf("%w: it is the kit of mesh %s, this mesh is %s; use this mesh's kit (nothing was changed)", seal.ErrBadKit, kit.Mesh(), mesh)
	}
	pub, _, err := db.RecoveryKit(ctx, node)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case pub == nil:
		return nil, nil, errors.New("this mesh has no recovery kit: make one with meshbox mesh kit on a node that holds the keys; without --kit the node waits for such a node (nothing was changed)")
	case seal.Fingerprint(pub) != kit.Fingerprint():
		return nil, nil, fmt.Errorf("%w: %s is not the mesh's current kit (%s): it was replaced; use the newest kit (nothing was changed)", seal.ErrBadKit, kit, seal.Fingerprint(pub))
	}
	copies, err := db.KitKeysFor(ctx, node, o.scopes)
	if err != nil {
		return nil, nil, err
	}
	_, holders, err := db.ContentKeys(ctx)
	if err != nil {
		return nil, nil, err
	}
	nk, err := seal.GenerateNodeKey()
	if err != nil {
		return nil, nil, err
	}
	var out []meshdb.SealedCopy
	var stale []string
	staleHolders := map[string][]string{}
	for _, c := range copies {
		if c.Sealed == nil || c.SealedFor != kit.Fingerprint() {
			for _, h := range holders {
				if h.KeyID == c.ID {
					staleHolders[c.ID] = append(staleHolders[c.ID], h.Node)
				}
			}
			if len(staleHolders[c.ID]) > 0 && !slices.Contains(o.lostKeys, c.ID) {
				stale = append(stale, c.ID)
			}
			continue // held by nobody yet: the node makes it itself
		}
		if slices.Contains(o.lostKeys, c.ID) {
			return nil, nil, fmt.Errorf("--lost-keys %s: the recovery kit opens that key; name only keys it has no copy of (nothing was changed)", c.ID)
		}
		raw, err := kit.Open(seal.KitKeyInfo(c.ID, mesh), c.Sealed)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: its copy of content key %s does not open with it: %v (nothing was changed)", seal.ErrBadKit, c.ID, err)
		}
		k, err := seal.ContentKeyFrom(c.ID, raw)
		if err == nil && len(c.Commitment) > 0 {
			err = k.CheckCommitment(c.Commitment)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("the kit's copy of content key %s is not the key the mesh uses: %v; a node that holds it seals it again once its copy is removed (nothing was changed)", c.ID, err)
		}
		blob, err := seal.SealTo(nk.Public(), seal.ContentKeyInfo(c.ID, node), k.Bytes())
		if err != nil {
			return nil, nil, err
		}
		out = append(out, meshdb.SealedCopy{ID: c.ID, Sealed: blob})
	}
	for _, id := range o.lostKeys {
		if len(staleHolders[id]) == 0 {
			return nil, nil, fmt.Errorf("--lost-keys %s: not an active content key of this node's that a node holds without a copy for the kit (meshbox mesh key list shows the keys; nothing was changed)", id)
		}
	}
	if len(stale) > 0 {
		var held []string
		for _, id := range stale {
			held = append(held, id+" (held by "+strings.Join(staleHolders[id], ",")+")")
		}
		return nil, nil, fmt.Errorf("the recovery kit has no copy of content key %s: made or rotated since those nodes last sealed the keys for the kit. "+
			"Start one of them and it seals it for the kit, then add the node again; if none of them is left, what was sealed with it cannot be opened: "+
			"add the node with --lost-keys %s to recover the rest (nothing was changed)", strings.Join(held, ", "), strings.Join(stale, ","))
	}
	return nk, out, nil
}
