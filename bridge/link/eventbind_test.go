package link

import (
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// After a restart the keys of the previous run (its record, or an older
// meshbox's evt.# when it left none) are wanted beside the current
// interest for EventKeepAfterStart, and not after.
func TestEventBinderKeepsThePreviousRun(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	path := filepath.Join(t.TempDir(), "event-bindings.json")
	if err := os.WriteFile(path, []byte(`{"Keys":["evo.b.old"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name     string
		path     string
		upgraded bool
		kept     string
	}{
		{"recorded", path, false, "evo.b.old"},
		{"older meshbox", filepath.Join(t.TempDir(), "none.json"), true, "evt.#"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var b EventBinder
			b.Open("a", tt.path, tt.upgraded, log, NewMetrics())
			b.SetInterest([]string{"new"})
			b.SetPeers([]string{"a", "b"}, false)
			now := time.Now()
			b.mu.Lock()
			during := slices.Sorted(maps.Keys(b.wantLocked(now)))
			after := slices.Sorted(maps.Keys(b.wantLocked(now.Add(EventKeepAfterStart + time.Second))))
			b.mu.Unlock()
			if want := []string{"evo.b.new", tt.kept}; !slices.Equal(during, want) {
				t.Errorf("after the start: %q, want %q", during, want)
			}
			if want := []string{"evo.b.new"}; !slices.Equal(after, want) {
				t.Errorf("after the keep: %q, want %q", after, want)
			}
		})
	}
}

// A node whose broker user may not bind narrow keys wants evt.# alone, and
// only while something is listened to.
func TestEventBinderRefusedBindsEverything(t *testing.T) {
	var b EventBinder
	b.Open("a", "", false, slog.New(slog.DiscardHandler), NewMetrics())
	b.SetPeers([]string{"b"}, false)
	b.refused = true
	if got := b.wantLocked(time.Now()); len(got) != 0 {
		t.Errorf("nothing listened to: %v, want nothing", got)
	}
	b.SetInterest([]string{"x.*"})
	if got := slices.Sorted(maps.Keys(b.wantLocked(time.Now()))); !slices.Equal(got, []string{"evt.#"}) {
		t.Errorf("refused: %q, want evt.#", got)
	}
}
