package keys

import (
	"encoding/base64"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/seal"
)

func TestChooseCurrent(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	later := t0.Add(time.Hour)
	retired := t0.Add(-time.Minute)
	pa, pb := base64.StdEncoding.EncodeToString([]byte("pub-a")), base64.StdEncoding.EncodeToString([]byte("pub-b"))
	fa, fb := seal.Fingerprint([]byte("pub-a")), seal.Fingerprint([]byte("pub-b"))
	nodes := []cache.NodeRecord{{Name: "a", PublicKey: pa}, {Name: "b", PublicKey: pb}, {Name: "c"}}
	keys := []cache.ContentKey{{ID: "k1", CreatedAt: t0}, {ID: "k2", CreatedAt: later}}
	// holders("k1/a", "k2/b?"): a holds k1 and opens it; b holds k2 and
	// does not open it yet.
	holders := func(hs ...string) []cache.KeyHolder {
		var out []cache.KeyHolder
		for _, h := range hs {
			opened := !strings.HasSuffix(h, "?")
			id, node, _ := strings.Cut(strings.TrimSuffix(h, "?"), "/")
			fpr := fa
			if node == "b" {
				fpr = fb
			}
			out = append(out, cache.KeyHolder{KeyID: id, Node: node, SealedFor: fpr, Opened: opened})
		}
		return out
	}
	tests := []struct {
		name string
		b    cache.Bindings
		held []string
		want string
	}{
		{"nothing held", cache.Bindings{Nodes: nodes, ContentKeys: keys}, nil, ""},
		{"one key, not yet at b", cache.Bindings{Nodes: nodes, ContentKeys: keys[:1], KeyHolders: holders("k1/a")}, []string{"k1"}, "k1"},
		{"rotation: k2 not everywhere yet", cache.Bindings{Nodes: nodes, ContentKeys: keys, KeyHolders: holders("k1/a", "k1/b", "k2/a")},
			[]string{"k1", "k2"}, "k1"},
		{"rotation: k2 held everywhere, b does not open it yet", cache.Bindings{Nodes: nodes, ContentKeys: keys, KeyHolders: holders("k1/a", "k1/b", "k2/a", "k2/b?")},
			[]string{"k1", "k2"}, "k1"},
		{"rotation: k2 everywhere (c has no public key)", cache.Bindings{Nodes: nodes, ContentKeys: keys, KeyHolders: holders("k1/a", "k1/b", "k2/a", "k2/b")},
			[]string{"k1", "k2"}, "k2"},
		{"k1 retired", cache.Bindings{Nodes: nodes, ContentKeys: []cache.ContentKey{{ID: "k1", CreatedAt: t0, RetireAt: &retired}, keys[1]},
			KeyHolders: holders("k2/a")}, []string{"k1", "k2"}, "k2"},
		// A compromised node held k1: nobody seals with it, and k2 only
		// once every node holds it.
		{"k1 compromised, k2 not everywhere yet: nothing", cache.Bindings{Nodes: nodes, ContentKeys: compromised(keys, later),
			KeyHolders: holders("k1/a", "k1/b", "k2/a")}, []string{"k1", "k2"}, ""},
		{"k1 compromised, k2 not held: nothing", cache.Bindings{Nodes: nodes, ContentKeys: compromised(keys, later),
			KeyHolders: holders("k1/a", "k1/b")}, []string{"k1"}, ""},
		{"k1 compromised, k2 everywhere", cache.Bindings{Nodes: nodes, ContentKeys: compromised(keys, later),
			KeyHolders: holders("k1/a", "k1/b", "k2/a", "k2/b")}, []string{"k1", "k2"}, "k2"},
		{"k1 compromised and retired, k2 not everywhere: k2", cache.Bindings{Nodes: nodes, ContentKeys: compromised(keys, retired),
			KeyHolders: holders("k2/a")}, []string{"k2"}, "k2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			held := map[string]bool{}
			for _, id := range tt.held {
				held[id] = true
			}
			if got := chooseCurrent(tt.b, "", held, t0); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}

	// A compromised key of another scope does not hold the mesh's back.
	other := cache.Bindings{Nodes: nodes, Scopes: []cache.Scope{{Name: "vault", Members: []string{"a"}}},
		ContentKeys: append(compromised([]cache.ContentKey{{ID: "kv", Scope: "vault", CreatedAt: t0}}, later), keys...),
		KeyHolders:  holders("k1/a", "k2/a")}
	if got := chooseCurrent(other, "", map[string]bool{"k1": true, "k2": true}, t0); got != "k1" {
		t.Errorf("the mesh's key beside a compromised key of scope vault: got %q, want k1", got)
	}

	// A scope's key: only its members count, and the mesh's choice ignores it.
	scoped := cache.Bindings{Nodes: nodes, Scopes: []cache.Scope{{Name: "vault", Members: []string{"a"}}},
		ContentKeys: []cache.ContentKey{keys[0], {ID: "kv", Scope: "vault", CreatedAt: later}},
		KeyHolders:  holders("k1/a", "k1/b", "kv/a")}
	held := map[string]bool{"k1": true, "kv": true}
	if got := chooseCurrent(scoped, "vault", held, t0); got != "kv" {
		t.Errorf("scope vault held by its only member a: got %q, want kv (b is not a member)", got)
	}
	if got := chooseCurrent(scoped, "", held, t0); got != "k1" {
		t.Errorf("the mesh's key with a scope's newer: got %q, want k1", got)
	}
}

// TestKeyKeeperOpensItsCopies: the keeper opens its own sealed copies into
// the keyring, says which active key it lacks, forgets a retired key, and
// opens a sealed grant credential.
func TestKeyKeeperOpensItsCopies(t *testing.T) {
	dir := t.TempDir()
	k, err := LoadNodeKey(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	kk, err := New(Config{Node: "a", DataDir: dir, Key: k, Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	kk.now = func() time.Time { return now }
	ck := seal.NewContentKey()
	ck, _ = seal.ContentKeyFrom("k1", ck.Bytes())
	sealed, err := seal.SealTo(kk.key.Public(), seal.ContentKeyInfo("k1", "a"), ck.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	pub := base64.StdEncoding.EncodeToString(kk.key.Public())
	b := cache.Bindings{
		Nodes:       []cache.NodeRecord{{Name: "a", PublicKey: pub}},
		ContentKeys: []cache.ContentKey{{ID: "k1", CreatedAt: now}, {ID: "k2", CreatedAt: now}},
		SealedKeys:  []cache.SealedKey{{ID: "k1", SealedFor: kk.key.Fingerprint(), Sealed: sealed}},
		KeyHolders:  []cache.KeyHolder{{KeyID: "k1", Node: "a", SealedFor: kk.key.Fingerprint()}},
	}
	kk.applyKeys(cache.Snapshot{Bindings: b})
	st := kk.Status()
	if st.Current != "k1" || len(st.Held) != 1 || len(st.Lacking) != 1 || st.Lacking[0] != "k2" {
		t.Fatalf("status: got %+v, want current k1, lacking k2", st)
	}
	// The ring opens what k1 seals.
	ring, _ := seal.NewKeyring([]seal.ContentKey{ck}, "k1")
	sl, _ := ring.Sealer()
	msg := sl.Seal(nil, []byte("ad"), []byte("hello"))
	if pt, err := kk.ring.Open(nil, "k1", []byte("ad"), msg); err != nil || string(pt) != "hello" {
		t.Fatalf("the keeper's ring opens k1: %q %v", pt, err)
	}
	// A copy sealed for another node's name does not open.
	other, _ := seal.SealTo(kk.key.Public(), seal.ContentKeyInfo("k2", "b"), ck.Bytes())
	b.SealedKeys = append(b.SealedKeys, cache.SealedKey{ID: "k2", SealedFor: kk.key.Fingerprint(), Sealed: other})
	kk.applyKeys(cache.Snapshot{Bindings: b})
	if kk.ring.Has("k2") {
		t.Fatal("a copy sealed for node b opened as node a's")
	}
	// k1 retires: forgotten.
	past := now.Add(-time.Second)
	b.ContentKeys[0].RetireAt = &past
	kk.applyKeys(cache.Snapshot{Bindings: b})
	if kk.ring.Has("k1") || kk.Status().Current != "" {
		t.Fatalf("retired k1 still held: %+v", kk.Status())
	}

	cred, err := seal.SealTo(kk.key.Public(), seal.GrantInfo("a", "bucket", "p"), []byte("pw-1234"))
	if err != nil {
		t.Fatal(err)
	}
	g := cache.Grant{Consumer: "a", Resource: "bucket", Provider: "p", SealedCredential: base64.StdEncoding.EncodeToString(cred)}
	if got, err := kk.OpenGrant(g); err != nil || got.Reveal() != "pw-1234" {
		t.Fatalf("open grant: got %v %v, want pw-1234", got.Reveal(), err)
	}
	g.Resource = "other"
	if _, err := kk.OpenGrant(g); err == nil {
		t.Fatal("a credential sealed for another grant opened")
	}
}

// compromised returns keys with the first marked compromised and retiring
// at retire.
func compromised(keys []cache.ContentKey, retire time.Time) []cache.ContentKey {
	out := append([]cache.ContentKey(nil), keys...)
	out[0].Compromised, out[0].RetireAt = true, &retire
	return out
}
