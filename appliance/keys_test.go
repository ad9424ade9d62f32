package appliance

import (
	"encoding/base64"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbox/meshbox/appliance/keys"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/seal"
)

// TestLackedKeyLeavesTheStatus: the warning that the node lacks a content
// key is in the status's recent errors, at the level it was logged, until
// the key arrives; then it is gone (the log keeps it).
func TestLackedKeyLeavesTheStatus(t *testing.T) {
	dir := t.TempDir()
	k, err := keys.LoadNodeKey(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ring := newErrorRing(10)
	log := slog.New(&ringHandler{next: slog.DiscardHandler, ring: ring}).With("component", "keys")
	now := time.Now()
	kk, err := keys.New(keys.Config{Node: "a", DataDir: dir, Key: k, Logger: log, Registerer: prometheus.NewRegistry(),
		ConditionKey: conditionKey, Ended: ring.end, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	pub := base64.StdEncoding.EncodeToString(k.Public())
	b := cache.Bindings{
		Nodes:       []cache.NodeRecord{{Name: "a", PublicKey: pub}},
		ContentKeys: []cache.ContentKey{{ID: "k1", CreatedAt: now}},
	}
	lacked := func() []ErrorEntry {
		var out []ErrorEntry
		for _, e := range ring.recent() {
			if strings.Contains(e.Message, "lacks a content key") {
				out = append(out, e)
			}
		}
		return out
	}
	kk.Apply(cache.Snapshot{Bindings: b})
	if got := lacked(); len(got) != 1 || got[0].Level != "WARN" || got[0].Component != "keys" {
		t.Fatalf("before the key arrives: recent errors %+v, want one WARN from keys", ring.recent())
	}
	// A node holding k1 seals it for this one.
	ck := seal.NewContentKey()
	sealed, err := seal.SealTo(k.Public(), seal.ContentKeyInfo("k1", "a"), ck.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	b.SealedKeys = []cache.SealedKey{{ID: "k1", SealedFor: k.Fingerprint(), Sealed: sealed}}
	b.KeyHolders = []cache.KeyHolder{{KeyID: "k1", Node: "a", SealedFor: k.Fingerprint()}}
	kk.Apply(cache.Snapshot{Bindings: b})
	if st := kk.Status(); len(st.Lacking) != 0 {
		t.Fatalf("keys status: got %+v, want nothing lacking", st)
	}
	if got := lacked(); len(got) != 0 {
		t.Errorf("after the key arrived: recent errors %+v, want the lack gone", got)
	}

	// A second key the node lacks, then retired before it arrives: gone too.
	b.ContentKeys = append(b.ContentKeys, cache.ContentKey{ID: "k2", CreatedAt: now})
	kk.Apply(cache.Snapshot{Bindings: b})
	if got := lacked(); len(got) != 1 {
		t.Fatalf("k2 lacked: recent errors %+v, want its warning", ring.recent())
	}
	past := now.Add(-time.Second)
	b.ContentKeys[1].RetireAt = &past
	kk.Apply(cache.Snapshot{Bindings: b})
	if got := lacked(); len(got) != 0 {
		t.Errorf("k2 retired: recent errors %+v, want the lack gone", got)
	}
}
