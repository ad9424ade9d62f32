package keys

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/seal"
)

// This file opens and checks this node's sealed copies of content keys
// (see keys.go): a copy is used only if it opens with the node's key, is a
// content key, and matches the key's commitment; one that does not is
// refused, and sync removes it from the database.

// openCopy opens sk, this node's copy of content key ck, or takes it from
// the keys opened before when its bytes did not change, and checks it.
// committed is false for a key claimed before commitments (taken, and
// logged once); ok is false for a copy refused. kk.mu is held.
func (kk *Keeper) openCopy(sk cache.SealedKey, ck cache.ContentKey) (o openedKey, committed, ok bool) {
	sum := sha256.Sum256(sk.Sealed)
	o, cached := kk.opened[sk.ID]
	if !cached || o.sum != sum {
		raw, err := kk.key.Open(seal.ContentKeyInfo(sk.ID, kk.node), sk.Sealed)
		if err != nil {
			kk.refuse(sk, sum, RefusedUnopenable, err)
			return openedKey{}, false, false
		}
		k, err := seal.ContentKeyFrom(sk.ID, raw)
		if err != nil {
			kk.refuse(sk, sum, RefusedInvalid, err)
			return openedKey{}, false, false
		}
		o = openedKey{sum: sum, key: k}
	}
	// Checked on every change of the bindings, cached or not: the
	// commitment may arrive after the copy (bindings from a cache).
	if len(ck.Commitment) > 0 {
		if err := o.key.CheckCommitment(ck.Commitment); err != nil {
			kk.refuse(sk, sum, RefusedCommitment, err)
			return openedKey{}, false, false
		}
	} else if !kk.uncommitLog[sk.ID] {
		kk.uncommitLog[sk.ID] = true
		kk.log.Warn("this node holds a content key that has no commitment (claimed before commitments): its copies cannot be checked; rotate it",
			"key", sk.ID, "scope", ck.Scope)
	}
	return o, len(ck.Commitment) > 0, true
}

// refuse records that this node refuses its sealed copy sk (of SHA-256
// sum) for reason: sync removes it from the database. Each copy is counted
// and logged once. kk.mu is held.
func (kk *Keeper) refuse(sk cache.SealedKey, sum [32]byte, reason string, err error) {
	kk.refused[sk.ID] = refusedCopy{copy: sk, reason: reason}
	seen := sk.ID + "/" + hex.EncodeToString(sum[:]) + "/" + reason
	if kk.seen[seen] {
		return
	}
	if len(kk.seen) >= maxSeenRefused {
		clear(kk.seen) // bounded: a flood of bad copies is logged again
	}
	kk.seen[seen] = true
	kk.refusedTotal.WithLabelValues(reason).Inc()
	by := sk.SealedBy
	if by == "" {
		by = "unknown"
	}
	kk.log.Error("refused a sealed copy of a content key; removing it so that a node holding the key seals it again",
		"key", sk.ID, "reason", reason, "sealed_by", by, "err", err)
}
