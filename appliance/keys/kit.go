package keys

import (
	"context"

	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
)

// This file seals the keys this node holds for the mesh's recovery kit
// (cache/meshdb/kit.go), as sync seals them for other nodes: every key
// held, the mesh's and its scopes', gets one copy sealed to the kit's
// public key, sealed again when a key is made or rotated or the kit is
// made anew. Whoever holds the kit opens them when no node that holds the
// keys is running.

// sealForKit seals the keys in mine that lack a copy sealed to the mesh's
// recovery kit, if it has one, and logs the keys it sealed on one line.
// changed says whether it wrote.
func (kk *Keeper) sealForKit(ctx context.Context, mine []seal.ContentKey) (changed bool, err error) {
	if len(mine) == 0 {
		return false, nil
	}
	pub, copies, err := kk.db.RecoveryKit(ctx, kk.node)
	if err != nil || pub == nil {
		return false, err
	}
	fpr := seal.Fingerprint(pub)
	mesh := ""
	for _, k := range mine {
		if copies[k.ID] == fpr {
			continue
		}
		if mesh == "" {
			if mesh, err = kk.db.MeshID(ctx); err != nil {
				return changed, err
			}
		}
		blob, err := seal.SealTo(pub, seal.KitKeyInfo(k.ID, mesh), k.Bytes())
		if err != nil {
			kk.log.Warn("cannot seal a content key for the recovery kit: its public key is not valid", "key", k.ID, "err", err)
			return changed, nil
		}
		wrote, err := kk.db.PutKitKey(ctx, k.ID, kk.node, fpr, blob)
		if err != nil {
			return changed, err
		}
		if wrote {
			changed = true
			kk.event(meshdb.KeySealed, "sealed a content key for the recovery kit", "key", k.ID, "scope", k.Scope, "kit", fpr)
		}
	}
	return changed, nil
}
