package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestEndLine: on a terminal, a reply that does not end its line gets a
// line break; a pipe or a file gets the reply's exact bytes.
func TestEndLine(t *testing.T) {
	for _, tc := range []struct {
		terminal bool
		data     string
		want     bool
	}{
		{true, "echo:hi", true},
		{true, "echo:hi\n", false},
		{true, "", false},
		{false, "echo:hi", false},
		{false, "", false},
	} {
		if got := endLine(tc.terminal, []byte(tc.data)); got != tc.want {
			t.Errorf("endLine(%v, %q): got %v, want %v", tc.terminal, tc.data, got, tc.want)
		}
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if isTerminal(f) {
		t.Error("a regular file is taken for a terminal")
	}
}
