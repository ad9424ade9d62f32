package link

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// An event is kept local only on a connected link, with a view of the
// other nodes' interest taken after discovery heard of the connection,
// and only when no other node listens. Leaving the connection (or
// handing it over) makes no view count until the next one.
func TestKeepLocal(t *testing.T) {
	var b EventBinder
	door := func(topic string) bool { return topic == "door" }
	t0 := time.Now()
	b.SetListeners(false, "", []string{"door"}, door, t0.Add(time.Millisecond))
	if b.KeepLocal("hall", true) {
		t.Fatal("kept before the link ever connected")
	}
	b.Connected(t0)
	if !b.KeepLocal("hall", true) {
		t.Fatal("hall, which nobody listens to, not kept on a connected link with a current view")
	}
	if b.KeepLocal("door", true) {
		t.Fatal("door, which another node listens to, kept")
	}
	if b.KeepLocal("hall", false) {
		t.Fatal("kept while the link is not connected: the outbox keeps every event")
	}
	b.Disconnected()
	if b.KeepLocal("hall", true) {
		t.Fatal("kept after the link left its connection, before the next was heard of")
	}
	b.Connected(t0.Add(2 * time.Millisecond))
	if b.KeepLocal("hall", true) {
		t.Fatal("kept with a view taken before the link's connection")
	}
	b.SetListeners(true, "node c not heard yet", nil, nil, t0.Add(3*time.Millisecond))
	if b.KeepLocal("hall", true) {
		t.Fatal("kept with a view that says any node may listen")
	}
	if st := b.listenersStatus(); st == nil || !st.All || st.Why != "node c not heard yet" || st.KeptLocal != 1 {
		t.Fatalf("status: %+v", st)
	}
}

// The previous run's patterns are read back from the record of the keys
// bound: lanes and shared keys alike, once each.
func TestPriorEventPatterns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "event-bindings.json")
	if got := PriorEventPatterns(path); got != nil {
		t.Fatalf("no record: %q", got)
	}
	if err := os.WriteFile(path, []byte(`{"Keys":["evo.alpha.room.#","evo.beta.room.#","evt.door.*","evo.gamma.a.b"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := PriorEventPatterns(path), []string{"a.b", "door.*", "room.#"}; !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if err := os.WriteFile(path, []byte(`{"Keys":`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := PriorEventPatterns(path); got != nil {
		t.Fatalf("damaged record: %q", got)
	}
}
