package appliance

import (
	"fmt"

	"github.com/meshbox/meshbox/appliance/keys"
	"github.com/meshbox/meshbox/cache"
)

// The appliance's side of the node's keys (package keys): in a mesh with a
// database, Start starts the key keeper after the bindings, and every
// change of the bindings reaches it first (bindingsChanged).

// KeysStatus is the keys part of the node's status.
type KeysStatus = keys.Status

// startKeys starts the key keeper with the node's key pair the bindings
// loaded and applies the bindings' keys. a.mu is held.
func (a *Appliance) startKeys() error {
	bd := a.parts().bindings
	kk, err := keys.New(keys.Config{
		Node: a.cfg.Node, DataDir: a.cfg.DataDir, Key: bd.nodeKey, DB: bd.db,
		Logger: a.logger.With("component", "keys"), Registerer: a.tel.registry,
		ConditionKey: conditionKey, Ended: a.tel.errs.end,
	})
	if err != nil {
		return fmt.Errorf("keys: %w", err)
	}
	kk.Start()
	a.update(func(r *running) { r.keys = kk })
	// A change of the bindings may land before or after update: applying
	// the current ones here too misses none.
	if snap, ok := bd.manager.Current(); ok {
		kk.Apply(snap)
	}
	return nil
}

// OpenGrant returns the credential of one of this node's grants, opened in
// memory; ErrNoNodeKey without a mesh database (standalone: no grants).
func (a *Appliance) OpenGrant(g cache.Grant) (cache.Credential, error) {
	kk := a.parts().keys
	if kk == nil {
		return "", ErrNoNodeKey
	}
	return kk.OpenGrant(g)
}
