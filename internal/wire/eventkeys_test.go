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

func TestCoverPatterns(t *testing.T) {
	for _, tt := range []struct{ in, want []string }{
		{[]string{"b", "a", "a"}, []string{"a", "b"}},
		{[]string{"room", "room.#"}, []string{"room.#"}},
		{[]string{"room.*", "room.#", "room.temp"}, []string{"room.#"}},
		{[]string{"a.*", "a.b", "c"}, []string{"a.*", "c"}},
		{[]string{"a.*", "a.#.b"}, []string{"a.#.b", "a.*"}},
		{[]string{"x", "#"}, []string{"#"}},
		{[]string{"*.b", "a.*"}, []string{"*.b", "a.*"}},
		{nil, nil},
	} {
		if got := CoverPatterns(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("CoverPatterns(%q): got %q, want %q", tt.in, got, tt.want)
		}
	}
}
