package wire

import (
	"strings"
	"testing"
)

func TestMessageLimits(t *testing.T) {
	tests := []struct {
		what string
		got  bool
		want bool
	}{
		{"id", ValidID("m-1"), true},
		{"id of MaxIDLen bytes", ValidID(strings.Repeat("i", MaxIDLen)), true},
		{"id past MaxIDLen", ValidID(strings.Repeat("i", MaxIDLen+1)), false},
		{"empty id", ValidID(""), false},
		{"id with a space", ValidID("a b"), false},
		{"id with a control byte", ValidID("a\x00"), false},
		{"id with a non-ASCII byte", ValidID("café"), false},
		{"header key", ValidHeaderKey("Content-Type"), true},
		{"header key of MaxHeaderKey bytes", ValidHeaderKey(strings.Repeat("k", MaxHeaderKey)), true},
		{"header key past MaxHeaderKey", ValidHeaderKey(strings.Repeat("k", MaxHeaderKey+1)), false},
		{"empty header key", ValidHeaderKey(""), false},
		{"header key with a colon", ValidHeaderKey("a:b"), false},
		{"header key with a space", ValidHeaderKey("a b"), false},
		{"header value", ValidHeaderValue("text/plain; charset=utf-8"), true},
		{"empty header value", ValidHeaderValue(""), true},
		{"header value with CR", ValidHeaderValue("a\rb"), false},
		{"header value with LF", ValidHeaderValue("a\nb"), false},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got valid=%v, want %v", tt.what, tt.got, tt.want)
		}
	}
}
