package keys

import (
	"bytes"
	"encoding/base64"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
)

// TestKeyKeeperCountsKeyEvents: each key event the keeper takes part in
// while applying bindings — a copy sealed with the recovery kit opened, a
// new key sealed with, a key marked compromised, a copy withdrawn, a key
// retired — is one count of its kind and one log line with key_event.
func TestKeyKeeperCountsKeyEvents(t *testing.T) {
	dir := t.TempDir()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	k, err := LoadNodeKey(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	kk, err := New(Config{Node: "a", DataDir: dir, Key: k, Logger: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	kk.now = func() time.Time { return now }
	fpr := kk.key.Fingerprint()
	copyOf := func(id, by string) cache.SealedKey {
		ck, _ := seal.ContentKeyFrom(id, seal.NewContentKey().Bytes())
		sealed, err := seal.SealTo(kk.key.Public(), seal.ContentKeyInfo(id, "a"), ck.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return cache.SealedKey{ID: id, SealedFor: fpr, Sealed: sealed, SealedBy: by}
	}
	opened := func(ids ...string) []cache.KeyHolder {
		var out []cache.KeyHolder
		for _, id := range ids {
			out = append(out, cache.KeyHolder{KeyID: id, Node: "a", SealedFor: fpr, Opened: true})
		}
		return out
	}
	pub := base64.StdEncoding.EncodeToString(kk.key.Public())
	later := now.Add(time.Hour)
	b := cache.Bindings{
		Nodes:       []cache.NodeRecord{{Name: "a", PublicKey: pub}},
		ContentKeys: []cache.ContentKey{{ID: "k1", CreatedAt: now}},
		SealedKeys:  []cache.SealedKey{copyOf("k1", meshdb.KitSealedBy)},
		KeyHolders:  opened("k1"),
	}
	want := map[string]float64{}
	step := func(what string) {
		t.Helper()
		kk.applyKeys(cache.Snapshot{Bindings: b})
		for _, kind := range meshdb.KeyEventKinds {
			var m dto.Metric
			if err := kk.events.WithLabelValues(kind).Write(&m); err != nil {
				t.Fatal(err)
			}
			if got := m.GetCounter().GetValue(); got != want[kind] {
				t.Errorf("%s: %s events: got %v, want %v", what, kind, got, want[kind])
			}
		}
	}
	want[meshdb.KeyRecovered] = 1
	step("k1 opened from a copy sealed with the kit")
	b.ContentKeys = append(b.ContentKeys, cache.ContentKey{ID: "k2", CreatedAt: now.Add(time.Second)})
	b.SealedKeys = append(b.SealedKeys, copyOf("k2", "b"))
	b.KeyHolders = opened("k1", "k2")
	want[meshdb.KeyRotated] = 1
	step("sealing with k2 in place of k1")
	if st := kk.Status(); st.Current != "k2" {
		t.Fatalf("current %q, want k2", st.Current)
	}
	// k1 and k2 compromised (a node removed as compromised held both),
	// k3 not held yet: nothing is sealed, then k3.
	for i := range b.ContentKeys {
		b.ContentKeys[i].Compromised, b.ContentKeys[i].RetireAt = true, &later
	}
	b.ContentKeys = append(b.ContentKeys, cache.ContentKey{ID: "k3", CreatedAt: now.Add(2 * time.Second)})
	want[meshdb.KeyRevoked] = 2
	step("k1 and k2 compromised")
	if st := kk.Status(); st.Current != "" {
		t.Fatalf("current %q with k1 and k2 compromised and k3 not held, want none", st.Current)
	}
	b.SealedKeys = append(b.SealedKeys, copyOf("k3", "b"))
	b.KeyHolders = opened("k1", "k2", "k3")
	want[meshdb.KeyRotated] = 2
	step("sealing with k3")
	// k1's copy withdrawn (the key active), then k2 retires.
	b.SealedKeys = b.SealedKeys[1:]
	want[meshdb.KeyRevoked] = 3
	step("k1's copy withdrawn")
	past := now.Add(-time.Second)
	b.ContentKeys[1].RetireAt = &past
	want[meshdb.KeyRetired] = 1
	step("k2 retired")
	if n := strings.Count(logs.String(), "key_event="); n != 7 {
		t.Errorf("%d log lines with key_event, want 7:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "seals nothing") || !strings.Contains(logs.String(), "sealing again") {
		t.Errorf("no line for the pause in sealing and its end:\n%s", logs.String())
	}
}
