package keys

import (
	"context"
	"encoding/base64"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
)

// This file is the key keeper's part in the mesh database (see keys.go):
// after each change of the bindings it publishes the node's public keys,
// claims keys nobody holds, seals held keys for the nodes that lack them
// and removes the copies this node refused.

// run does the database's part after each change of the bindings: publish
// the node's public key, claim keys nobody holds, seal held keys for nodes
// that lack them; and applies the bindings again when a key retires.
// Exits when Close closes quit.
func (kk *Keeper) run() {
	defer close(kk.done)
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	var lastErr string
	for {
		select {
		case <-kk.quit:
			return
		case <-kk.wake:
		case <-retry.C:
		}
		snap := kk.snap.Load()
		if snap == nil {
			continue
		}
		kk.applyKeys(*snap) // keys that retired since are forgotten
		ctx, cancel := context.WithTimeout(kk.ctx, 10*time.Second)
		changed, err := kk.sync(ctx, snap.Bindings)
		cancel()
		kk.mu.Lock()
		// In step only as of the bindings the node holds now: a round on
		// bindings that were replaced meanwhile says nothing about them.
		kk.status.InStep = err == nil && !changed && kk.snap.Load() == snap
		kk.mu.Unlock()
		next := nextRetire(snap.Bindings, kk.now())
		if err != nil {
			if err.Error() != lastErr {
				kk.log.Warn("keys not in step with the mesh database yet; trying again", "err", err)
			}
			lastErr = err.Error()
			next = min(next, keyRetry)
		} else {
			lastErr = ""
		}
		if next > 0 {
			retry.Reset(next)
		}
	}
}

// nextRetire is the time until the next active key retires (0: none).
func nextRetire(b cache.Bindings, now time.Time) time.Duration {
	var next time.Duration
	for _, ck := range b.ContentKeys {
		if ck.RetireAt == nil || ck.Retired(now) {
			continue
		}
		if d := ck.RetireAt.Sub(now) + time.Millisecond; next == 0 || d < next {
			next = d
		}
	}
	return next
}

// sync does one round of the database's part (see run). changed says
// whether it wrote anything (or tried to: a claim another node won); a
// round that changes nothing finds the keys in step.
func (kk *Keeper) sync(ctx context.Context, b cache.Bindings) (changed bool, err error) {
	if kk.db == nil {
		return false, nil
	}
	me, ok := b.NodeRecord(kk.node)
	if !ok {
		return false, errors.New("this node has no record in the mesh database: nowhere to publish its public key")
	}
	pub := base64.StdEncoding.EncodeToString(kk.key.Public())
	if me.PublicKey != pub {
		if err := kk.db.PublishNodeKey(ctx, kk.node, kk.key.Public()); err != nil {
			return false, err
		}
		kk.log.Info("published this node's public key", "node_key", kk.key.Fingerprint())
		return true, nil // the change comes back as new bindings
	}
	if spub := base64.StdEncoding.EncodeToString(kk.sign.Public()); me.SigningKey != spub {
		if err := kk.db.PublishSigningKey(ctx, kk.node, kk.sign.Public()); err != nil {
			return false, err
		}
		if me.SigningKey == "" {
			kk.log.Info("published this node's signing key", "signing_key", kk.sign.Fingerprint())
		} else {
			kk.log.Warn("published this node's signing key in place of another one; peers refuse its discovery messages until they load it", "signing_key", kk.sign.Fingerprint())
		}
		// No change to wait for when the database is older than signing
		// keys: the bindings then never show one.
	}
	// Copies this node refused go, so that a holder seals the key again.
	kk.mu.Lock()
	refused := slices.Collect(maps.Values(kk.refused))
	kk.mu.Unlock()
	for _, rc := range refused {
		dropped, err := kk.db.DropSealedKey(ctx, rc.copy.ID, kk.node, rc.copy.Sealed)
		if err != nil {
			return changed, err
		}
		if dropped {
			changed = true
			kk.log.Info("removed a refused copy of a content key from the mesh database", "key", rc.copy.ID, "reason", rc.reason)
		}
	}
	now := kk.now()
	holders := map[string]string{}
	held := map[string]bool{}
	for _, h := range b.KeyHolders {
		holders[h.KeyID+"/"+h.Node] = h.SealedFor
		held[h.KeyID] = true
	}
	for _, ck := range b.ContentKeys {
		if ck.Retired(now) || held[ck.ID] || !mayHold(b, ck.Scope, kk.node) {
			continue
		}
		// Nobody holds it: make it. Only one claim wins.
		k := seal.NewContentKey()
		k, err := seal.ContentKeyFrom(ck.ID, k.Bytes())
		if err != nil {
			return changed, err
		}
		sealed, err := seal.SealTo(kk.key.Public(), seal.ContentKeyInfo(ck.ID, kk.node), k.Bytes())
		if err != nil {
			return changed, err
		}
		won, err := kk.db.ClaimKey(ctx, ck.ID, kk.node, kk.key.Fingerprint(), sealed, k.Commitment())
		if err != nil {
			return changed, err
		}
		changed = true // by this node or the one that won
		if won {
			kk.event(meshdb.KeyMade, "made content key", "key", ck.ID, "scope", ck.Scope)
		}
	}
	kk.mu.Lock()
	mine := make([]seal.ContentKey, 0, len(kk.opened))
	for _, o := range kk.opened {
		mine = append(mine, o.key)
	}
	kk.mu.Unlock()
	// The keys in the keyring open messages now: say so, so that the others
	// start sealing with a new one only once every node opens it.
	opened := map[string]bool{}
	for _, h := range b.KeyHolders {
		if h.Node == kk.node && h.Opened && h.SealedFor == kk.key.Fingerprint() {
			opened[h.KeyID] = true
		}
	}
	for _, k := range mine {
		if opened[k.ID] || !kk.ring.Has(k.ID) {
			continue
		}
		marked, err := kk.db.MarkKeyOpened(ctx, k.ID, kk.node, kk.key.Fingerprint())
		if err != nil {
			return changed, err
		}
		changed = changed || marked
	}
	for _, k := range mine {
		for _, n := range b.Nodes {
			if n.PublicKey == "" || n.Name == kk.node || !mayHold(b, k.Scope, n.Name) {
				continue
			}
			raw, err := base64.StdEncoding.DecodeString(n.PublicKey)
			if err != nil {
				continue
			}
			fpr := seal.Fingerprint(raw)
			if holders[k.ID+"/"+n.Name] == fpr {
				continue
			}
			sealed, err := seal.SealTo(raw, seal.ContentKeyInfo(k.ID, n.Name), k.Bytes())
			if err != nil {
				kk.log.Warn("cannot seal a content key for a node: its public key is not valid", "node", n.Name, "key", k.ID, "err", err)
				continue
			}
			wrote, err := kk.db.PutSealedKey(ctx, k.ID, kk.node, n.Name, fpr, sealed)
			if err != nil {
				return changed, err
			}
			if wrote {
				changed = true
				kk.event(meshdb.KeySealed, "sealed a content key for a node", "key", k.ID, "scope", k.Scope, "for", n.Name)
			}
		}
	}
	// Where the keys are sealed for the nodes, they are for the kit too.
	kit, err := kk.sealForKit(ctx, mine)
	return changed || kit, err
}
