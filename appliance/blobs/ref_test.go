package blobs

import (
	"errors"
	"strings"
	"testing"
)

func TestParseRef(t *testing.T) {
	sum := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		in   string
		want Ref
		ok   bool
	}{
		{"blob:alpha/" + sum, Ref{"alpha", sum}, true},
		{"blob:node-2_x/" + sum, Ref{"node-2_x", sum}, true},
		{"alpha/" + sum, Ref{}, false},
		{"blob:alpha", Ref{}, false},
		{"blob:/" + sum, Ref{}, false},
		{"blob:al.pha/" + sum, Ref{}, false},
		{"blob:alpha/" + strings.ToUpper(sum), Ref{}, false},
		{"blob:alpha/" + sum[:63], Ref{}, false},
		{"blob:alpha/" + sum[:62] + "zz", Ref{}, false},
		{"blob:alpha/" + sum + "/x", Ref{}, false},
	} {
		got, err := ParseRef(tc.in)
		if tc.ok {
			if err != nil || got != tc.want {
				t.Errorf("ParseRef(%q): got %v, %v; want %v", tc.in, got, err, tc.want)
			}
			if got.String() != tc.in {
				t.Errorf("ParseRef(%q).String(): got %q", tc.in, got.String())
			}
			continue
		}
		if !errors.Is(err, ErrBadRef) {
			t.Errorf("ParseRef(%q): got %v, %v; want ErrBadRef", tc.in, got, err)
		}
	}
}
