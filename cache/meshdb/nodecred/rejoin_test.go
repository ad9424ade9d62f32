package nodecred_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/cache/meshdb/nodecred"
)

// TestRejoin: the node gets the next generation with a join token, which
// is reported before every older generation is revoked, without waiting.
func TestRejoin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMesh(t)
		m.node("bee", 0, 2, 3)
		added, err := m.r.Rejoin(t.Context(), "bee", "postgres://admin@db/mesh", 24*time.Hour)
		if err != nil {
			t.Fatalf("Rejoin: %v", err)
		}
		if added.Token.Node != "bee" || added.Token.DB != "postgres://admin@db/mesh" || added.Role != "role_bee_4" {
			t.Errorf("Rejoin: got %+v, want bee's token on the admin's database with role_bee_4", added)
		}
		m.wantSteps(t,
			"create bee g4 (node.bee.g4, role_bee_4) rev 1 token t1 expires +24h0m0s",
			"revoke bee g2 roles [role_bee_2]",
			"revoke bee g3 roles [role_bee_3]",
		)
		m.wantUsers(t, "bee", 4)
		if time.Since(m.start) != 0 {
			t.Errorf("Rejoin took %s, want no waiting", time.Since(m.start))
		}
		if len(m.broker.dropped) != 0 {
			t.Errorf("old exchanges dropped: got %v, want none (the node has not run on the new generation yet)", m.broker.dropped)
		}
	})
}

// TestRejoinChecks: an unknown node and one without a credential fail
// before anything changes; a node that goes away later is not "unknown".
func TestRejoinChecks(t *testing.T) {
	m := newMesh(t)
	m.node("hub", 0)
	m.node("bee", 0, 1)

	_, err := m.r.Rejoin(t.Context(), "nobody", "postgres://db", time.Hour)
	var nf *meshdb.NotFoundError
	if !errors.Is(err, nodecred.ErrUnknownNode) || !errors.As(err, &nf) || err.Error() != `node "nobody" not found` {
		t.Errorf("Rejoin(nobody): got %v, want ErrUnknownNode reading node \"nobody\" not found", err)
	}
	if _, err := m.r.Rejoin(t.Context(), "hub", "postgres://db", time.Hour); !errors.Is(err, nodecred.ErrNoCredential) {
		t.Errorf("Rejoin(hub): got %v, want ErrNoCredential", err)
	}
	if m.connects != 0 {
		t.Errorf("got %d connects, want none", m.connects)
	}

	m.db.failStages = &meshdb.NotFoundError{What: `node "bee"`} // removed meanwhile
	_, err = m.r.Rejoin(t.Context(), "bee", "postgres://db", time.Hour)
	if !errors.Is(err, meshdb.ErrNotFound) || errors.Is(err, nodecred.ErrUnknownNode) {
		t.Errorf("Rejoin(bee) after bee went away: got %v, want a not-found error that is not ErrUnknownNode", err)
	}
	m.wantUsers(t, "bee", 1)
	m.wantSteps(t)
}

// TestRejoinUndoesBrokerUser: when the database refuses the new
// generation, its broker user is deleted again and the older ones stay.
func TestRejoinUndoesBrokerUser(t *testing.T) {
	m := newMesh(t)
	m.node("bee", 0, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	m.db.failAdd, m.db.onAdd = errBoom, cancel
	_, err := m.r.Rejoin(ctx, "bee", "postgres://db", time.Hour)
	if !errors.Is(err, errBoom) || err.Error() != "node bee: boom" {
		t.Errorf("Rejoin: got %v, want node bee: boom", err)
	}
	m.wantUsers(t, "bee", 1)
	m.wantSteps(t)
}

// TestRejoinRevokeFails: the token is returned with the *RevokeError, and
// the generations that could be revoked are.
func TestRejoinRevokeFails(t *testing.T) {
	m := newMesh(t)
	m.node("bee", 0, 1, 2)
	m.broker.failDelete["bee/1"] = errors.New("user busy")
	added, err := m.r.Rejoin(t.Context(), "bee", "postgres://db", time.Hour)
	var re *nodecred.RevokeError
	if !errors.As(err, &re) || err.Error() != "node bee: revoke generation 1: user busy" {
		t.Fatalf("Rejoin: got %v, want a *RevokeError for generation 1", err)
	}
	if added.Token.ID != "t1" {
		t.Errorf("Rejoin: got token %+v, want the valid one", added.Token)
	}
	if got := m.broker.users["bee"]; len(got) != 2 || got[0] != 1 || got[1] != 3 {
		t.Errorf("bee's broker users: got %v, want [1 3]", got)
	}
}
