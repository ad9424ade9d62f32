package appliance

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/backoff"
)

// This file is the node's side of a credential rotation: the bindings
// bring a new generation of the node's credential, followBroker hands its
// broker user to the bridge (which switches make before break), the switch
// recorder moves the database login to its role (meshdb.SwitchLogin, make
// before break too) and tells the mesh database once both are in use, so
// that `meshbox mesh node rotate` may revoke the older generations. At a
// start, the node logs in with the newest role its cache knows.
// It also builds the identity part of the status.

// IdentityStatus is the node's identity on the broker: its broker user,
// the credential's generation and age, and any rotation in progress.
type IdentityStatus struct {
	BrokerUser string    `json:"broker_user"`
	Generation int       `json:"generation,omitempty"`
	CreatedAt  time.Time `json:"created_at,omitzero"` // of the generation in use, from the bindings
	AgeSeconds float64   `json:"age_seconds,omitempty"`
	// State is the bridge's: in use, switching, credential revoked, not
	// connected.
	State string `json:"state"`
	// Rotation describes a rotation in progress ("" when none).
	Rotation string `json:"rotation,omitempty"`
	// Peers are the credential generations other nodes last spoke with
	// (validated by the broker), by node.
	Peers map[string]int `json:"peers,omitempty"`
}

// identity computes the identity status from the bridge's credential and
// the bindings' newest generation.
func identity(c *bridge.CredentialStatus, newest *cache.BrokerCredential, now time.Time) *IdentityStatus {
	if c != nil && c.User == "" {
		c = nil // no broker, or not told its user yet: nothing to report
	}
	if c == nil && newest == nil {
		return nil
	}
	id := &IdentityStatus{State: bridge.CredentialUnused}
	if c != nil {
		id.BrokerUser, id.Generation, id.State = c.User, c.Generation, c.State
	}
	if newest == nil {
		return id
	}
	if id.BrokerUser == "" {
		id.BrokerUser, id.Generation = newest.User, newest.Generation
	}
	if newest.User == id.BrokerUser {
		id.CreatedAt = newest.CreatedAt
		id.AgeSeconds = max(0, now.Sub(newest.CreatedAt).Seconds())
	}
	switch {
	case newest.User != id.BrokerUser:
		id.Rotation = fmt.Sprintf("generation %d recorded; switching to it from %s", newest.Generation, id.BrokerUser)
	case newest.SwitchedAt.IsZero() && len(newest.Older) > 0:
		id.Rotation = fmt.Sprintf("switched to generation %d; recording the switch in the mesh database", newest.Generation)
	case len(newest.Older) > 0:
		id.Rotation = fmt.Sprintf("switched to generation %d at %s; older generations %v still valid until the admin revokes them",
			newest.Generation, newest.SwitchedAt.UTC().Format(time.RFC3339), newest.Older)
	}
	return id
}

// credentialChanged wakes the switch recorder. It must not block: the
// bridge calls it on its link goroutine.
func (a *Appliance) credentialChanged(string) {
	select {
	case a.follow.credWake <- struct{}{}:
	default:
	}
}

// credentialAcceptedBefore reports whether the bindings record that this
// node connected with broker user user (its switch to that generation),
// or hold a newer generation than user's: the broker's refusal of it is
// then a revocation.
func (a *Appliance) credentialAcceptedBefore(user string) bool {
	bd := a.parts().bindings
	if bd == nil || bd.manager == nil {
		return false
	}
	snap, ok := bd.manager.Current()
	if !ok {
		return false
	}
	c := snap.Bindings.Broker
	if c == nil {
		return false
	}
	if _, gen, ok := bridge.ParseBrokerUser(user); ok && gen < c.Generation {
		return true // a rotation made a newer one: this one was revoked
	}
	return c.User == user && !c.SwitchedAt.IsZero()
}

// runSwitchRecorder records in the mesh database that the bridge connects
// with the newest generation of the node's credential, once per
// generation, retrying with backoff while the database is away. Woken by
// credentialChanged (on a switch and on every bindings change). It exits
// when the appliance closes.
func (a *Appliance) runSwitchRecorder() {
	pause := backoff.Policy{Min: time.Second, Max: 30 * time.Second}
	failures := 0
	var retry <-chan time.Time
	log := a.logger.With("component", "identity")
	for {
		select {
		case <-a.quit:
			return
		case <-a.follow.credWake:
		case <-retry:
		}
		retry = nil
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := a.switchStep(ctx, log)
		cancel()
		if err != nil {
			failures++
			if failures == 1 {
				log.Warn("cannot finish the switch to the new credential yet; retrying", "err", err)
			}
			retry = time.After(pause.Delay(failures))
			continue
		}
		failures = 0
	}
}

// switchStep moves the database login to the newest generation's role and
// records the switch once the bridge connects with the newest broker user
// too. Nothing to do is not an error.
func (a *Appliance) switchStep(ctx context.Context, log *slog.Logger) error {
	bd := a.parts().bindings
	if bd == nil || bd.db == nil {
		return nil
	}
	snap, ok := bd.manager.Current()
	if !ok || snap.Bindings.Broker == nil {
		return nil
	}
	c := snap.Bindings.Broker
	if c.DBRole != "" && bd.db.User() != c.DBRole {
		if err := bd.db.SwitchLogin(ctx, c.DBRole, c.DBPassword.Reveal()); err != nil {
			return err
		}
		log.Info("database login switched to the new credential generation's role", "role", c.DBRole, "generation", c.Generation)
	}
	gen, ok := a.switchToRecord()
	if !ok {
		return nil
	}
	if err := bd.db.CredentialSwitched(ctx, gen); err != nil {
		return err
	}
	log.Info("switch to the new credential recorded in the mesh database", "generation", gen)
	return nil
}

// switchToRecord returns the generation to record: the bindings' newest,
// when the bridge connects with its broker user (and the database login is
// its role) and the database does not know yet.
func (a *Appliance) switchToRecord() (int, bool) {
	r := a.parts()
	b, bd := r.bridge, r.bindings
	if b == nil || bd == nil || bd.db == nil {
		return 0, false
	}
	snap, ok := bd.manager.Current()
	if !ok || snap.Bindings.Broker == nil || !snap.Bindings.Broker.SwitchedAt.IsZero() {
		return 0, false
	}
	c := b.Status().Broker.Credential
	if c == nil || c.State != bridge.CredentialInUse || c.User != snap.Bindings.Broker.User {
		return 0, false
	}
	if r := snap.Bindings.Broker.DBRole; r != "" && bd.db.User() != r {
		return 0, false
	}
	return snap.Bindings.Broker.Generation, true
}
