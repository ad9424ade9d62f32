package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
