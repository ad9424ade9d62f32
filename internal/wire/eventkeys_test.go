package wire

import (
	"slices"
	"testing"
)

func TestEventPattern(t *testing.T) {
	for _, tt := range []struct {
		subject, want string
		ok            bool
	}{
		{"evt.a", "a", true},
		{"evt.a.b", "a.b", true},
		{"evt.a.*", "a.*", true},
		{"evt.*.b", "*.b", true},
		{"evt.a.>", "a.#", true},
		{"evt.>", "#", true},
		{">", "#", true},
		{"*.>", "#", true},
		{"*.a", "a", true},
		{"*", "", false},
		{"evt", "", false},
		{"cap.a", "", false},
		{"_INBOX.x.y", "", false},
		{"evt.a.>.b", "", false},
		{"evt.a b", "", false},
		{"evt.a#", "", false},
		{"evt.ä", "", false},
	} {
		got, ok := EventPattern(tt.subject)
		if got != tt.want || ok != tt.ok {
			t.Errorf("EventPattern(%q): got %q, %v; want %q, %v", tt.subject, got, ok, tt.want, tt.ok)
		}
	}
}

func TestEventBindingKeys(t *testing.T) {
	got := EventBindingKeys(CoverPatterns([]string{"b.*", "a", "a"}), []string{"n1", "n2", "me"}, "me", false)
	want := []string{"evo.n1.a", "evo.n1.b.*", "evo.n2.a", "evo.n2.b.*"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	got = EventBindingKeys(CoverPatterns([]string{"a", "#"}), []string{"n1"}, "me", true)
	want = []string{"evo.n1.#", "evt.#"}
	if !slices.Equal(got, want) {
		t.Errorf("legacy: got %q, want %q", got, want)
	}
}
