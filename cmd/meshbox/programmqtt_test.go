package main

import "testing"

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"1048576", 1 << 20, true},
		{"1MiB", 1 << 20, true},
		{"256KiB", 256 << 10, true},
		{"2 GiB", 2 << 30, true},
		{"10B", 10, true},
		{"1MB", 0, false},
		{"-1KiB", 0, false},
		{"", 0, false},
	} {
		got, err := parseSize(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseSize(%q): got %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
	if got := formatSize(4 << 20); got != "4MiB" {
		t.Errorf("formatSize(4 MiB): got %q, want 4MiB", got)
	}
}
