package seal

import (
	"errors"
	"testing"
	"time"
)

func TestKeyringScopes(t *testing.T) {
	km, _ := ContentKeyFrom("kmesh", NewContentKey().Bytes())
	kv, _ := ContentKeyFrom("kvault", NewContentKey().Bytes())
	kv.Scope = "vault"
	r := &Keyring{}
	sc := Scopes{
		Current:  map[string]string{"vault": kv.ID},
		Bindings: map[string]string{BindingKey(BindStage, "ledger"): "vault"},
		Member:   map[string]bool{"vault": true},
		Members:  map[string][]string{"vault": {"alpha", "beta"}},
	}
	if err := r.SetScoped([]ContentKey{km, kv}, km.ID, sc); err != nil {
		t.Fatal(err)
	}
	if got := r.ScopeOf(BindStage, "ledger"); got != "vault" {
		t.Errorf("ScopeOf(stage, ledger): got %q, want vault", got)
	}
	if got := r.ScopeOf(BindCap, "ledger"); got != "" {
		t.Errorf("ScopeOf(cap, ledger): got %q, want none (bindings are per kind)", got)
	}
	if s, err := r.SealerFor("vault"); err != nil || s.ID() != kv.ID || s.Scope() != "vault" {
		t.Errorf("SealerFor(vault): got %v %v, want %s", s, err, kv.ID)
	}
	if s, err := r.SealerFor(""); err != nil || s.ID() != km.ID {
		t.Errorf("SealerFor(mesh): got %v %v, want %s", s, err, km.ID)
	}
	if _, err := r.SealerFor("other"); !errors.Is(err, ErrNotMember) {
		t.Errorf("SealerFor(other): got %v, want ErrNotMember", err)
	}
	if scope, ok := r.KeyScope(kv.ID); !ok || scope != "vault" {
		t.Errorf("KeyScope(%s): got %q %v, want vault", kv.ID, scope, ok)
	}
	if !r.Member("vault") || r.Member("other") || !r.Member("") {
		t.Error("Member: want vault and the mesh, not other")
	}
	if !r.InScope("vault", "beta") || r.InScope("vault", "gamma") || !r.InScope("", "gamma") {
		t.Error("InScope: want beta in vault, gamma not, and every node in the mesh")
	}

	// A member holding none of the scope's keys yet.
	if err := r.SetScoped([]ContentKey{km}, km.ID, Scopes{Member: map[string]bool{"vault": true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.SealerFor("vault"); !errors.Is(err, ErrNoKey) {
		t.Errorf("SealerFor(vault) without its key: got %v, want ErrNoKey", err)
	}
	// A scope's key is never the mesh's current key, nor another scope's.
	if err := r.SetScoped([]ContentKey{km, kv}, kv.ID, Scopes{}); err == nil {
		t.Error("a scope's key was accepted as the mesh's current key")
	}
	if err := r.SetScoped([]ContentKey{km, kv}, km.ID, Scopes{Current: map[string]string{"other": kv.ID}}); err == nil {
		t.Error("vault's key was accepted as scope other's current key")
	}
	// Set (no scopes) keeps working as before.
	if err := r.Set([]ContentKey{km}, km.ID); err != nil || r.ScopeOf(BindStage, "ledger") != "" {
		t.Errorf("Set: %v, scope of ledger %q", err, r.ScopeOf(BindStage, "ledger"))
	}
}

// A reader waiting for a key wakes when the keys are replaced, not on a
// poll: Changed's channel closes at the next Set, and only then.
func TestKeyringChangedWakesOnSet(t *testing.T) {
	r := &Keyring{}
	changed := r.Changed()
	select {
	case <-changed:
		t.Fatal("Changed is closed before any Set")
	default:
	}
	k := NewContentKey()
	if err := r.Set([]ContentKey{k}, k.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(time.Second):
		t.Fatal("Set did not close the channel Changed returned before it")
	}
	if again := r.Changed(); again == changed {
		t.Fatal("Changed returns the closed channel again: a second wait would not wait")
	}
}
