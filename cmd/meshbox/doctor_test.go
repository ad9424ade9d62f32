package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/cmd/meshbox/doctor"
)

func TestDoctorCommandStandalone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	m := &Main{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
	err := m.Run(context.Background(), []string{"doctor", "--node", "attic", "--data", dir, "--server", "nats://127.0.0.1:1",
		"--hosts", filepath.Join(t.TempDir(), "hosts"), "--json"})
	if err != nil {
		t.Fatalf("doctor on a standalone setup: %v\n%s", err, stdout.String())
	}
	var rep doctor.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, stdout.String())
	}
	if rep.Fail != 0 || len(rep.Checks) != rep.OK+rep.Warn {
		t.Errorf("got %d failed of %d, want none failed: %+v", rep.Fail, len(rep.Checks), rep.Checks)
	}
	byName := map[string]doctor.Check{}
	for _, c := range rep.Checks {
		byName[c.Name] = c
	}
	for name, want := range map[string]string{"data directory": doctor.OK, "node": doctor.Warn, "database": doctor.OK, "broker": doctor.OK, "local NATS": doctor.OK} {
		if got := byName[name].Status; got != want {
			t.Errorf("%s: got %q (%s), want %s", name, got, byName[name].Message, want)
		}
	}

	// A failing check makes the exit status non-zero.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	err = m.Run(context.Background(), []string{"doctor", "--node", "attic", "--data", dir, "--server", "nats://127.0.0.1:1",
		"--hosts", filepath.Join(t.TempDir(), "hosts")})
	if code := exitCode(&stderr, err); code != 1 {
		t.Errorf("exit status with a world-readable data dir: got %d, want 1\n%s", code, stdout.String())
	}
	if !strings.Contains(stdout.String(), "FAIL  data directory") {
		t.Errorf("report lacks the failed data directory check:\n%s", stdout.String())
	}

	// Bad flags are usage errors.
	err = m.Run(context.Background(), []string{"doctor", "--db", "mysql://x"})
	if err == nil || !strings.Contains(err.Error(), "db") {
		t.Errorf("bad --db: got %v, want an error naming db", err)
	}
}
