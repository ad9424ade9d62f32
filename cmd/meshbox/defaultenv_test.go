package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUnreadableDefaultEnvFile: a client command that cannot read the
// node's env file where it looks by default (a user who is not root on a
// packaged node, here a path that cannot be read as a file) says so and
// what to do, instead of talking to a node of the default configuration;
// told which node by other means, it passes the file over.
func TestUnreadableDefaultEnvFile(t *testing.T) {
	unreadable := []string{t.TempDir()} // a directory
	if os.Geteuid() != 0 {              // root reads any file
		f := filepath.Join(t.TempDir(), "meshbox.env")
		if err := os.WriteFile(f, []byte("MESHBOX_NATS=127.0.0.1:4333\n"), 0o000); err != nil {
			t.Fatal(err)
		}
		unreadable = append(unreadable, f)
	}
	missing := filepath.Join(t.TempDir(), "none", "meshbox.env")
	for _, path := range unreadable {
		run := func(env map[string]string, args ...string) error {
			m := &Main{Stdin: strings.NewReader(""), Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{},
				Getenv: func(k string) string { return env[k] }, envFiles: []string{missing, path}}
			return m.Run(t.Context(), args)
		}
		for _, args := range [][]string{{"status"}, {"call", "echo", "x"}, {"program", "list"}} {
			err := run(nil, args...)
			if err == nil || !strings.Contains(err.Error(), "cannot read the node's configuration "+path) ||
				!strings.Contains(err.Error(), "--env-file") || !strings.Contains(err.Error(), "root") {
				t.Errorf("meshbox %s with %s unreadable: got %v, want it to say the file cannot be read, and what to do", strings.Join(args, " "), path, err)
			}
		}
		// Told where the node is: the file is not needed.
		for _, tc := range []struct {
			env  map[string]string
			args []string
		}{
			{nil, []string{"status", "--server", "nats://127.0.0.1:1"}},
			{map[string]string{"MESHBOX_SERVER": "nats://127.0.0.1:1"}, []string{"status"}},
			{map[string]string{"MESHBOX_NATS": "127.0.0.1:1"}, []string{"status"}},
		} {
			err := run(tc.env, tc.args...)
			if err == nil || strings.Contains(err.Error(), "cannot read the node's configuration") {
				t.Errorf("meshbox %s (env %v): got %v, want it to try the node named", strings.Join(tc.args, " "), tc.env, err)
			}
		}
	}
}
