package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/cmd/meshbox/doctor"
)

// TestUnknownCommandSuggests: a misspelt command is a usage error (exit
// 2) that names the command meant.
func TestUnknownCommandSuggests(t *testing.T) {
	c := cli{env: map[string]string{}}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"stauts"}, `unknown command "stauts" (did you mean status?)`},
		{[]string{"help", "stauts"}, `unknown command "stauts" (did you mean status?)`},
		{[]string{"mesh", "stauts"}, `unknown command "stauts" (did you mean status?)`},
		{[]string{"mesh", "node", "ad", "x"}, `unknown command "node ad" (did you mean node add?)`},
		{[]string{"frobnicate"}, `unknown command "frobnicate"; run 'meshbox help'`},
	} {
		_, _, err := c.run(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("meshbox %s: got %v, want an error saying %s", strings.Join(tc.args, " "), err, tc.want)
		}
		if code := exitCode(&bytes.Buffer{}, err); code != 2 {
			t.Errorf("meshbox %s: exit %d, want 2", strings.Join(tc.args, " "), code)
		}
	}
}

// TestDoctorNamesUnknownVariables: doctor warns of a misspelt variable,
// with the name meant.
func TestDoctorNamesUnknownVariables(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	envFile := filepath.Join(t.TempDir(), "meshbox.env")
	if err := os.WriteFile(envFile, []byte("MESHBOX_NAT=127.0.0.1:4333\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	m := &Main{Stdout: &stdout, Stderr: &bytes.Buffer{}, Getenv: func(string) string { return "" },
		Environ: func() []string { return []string{"MESHBOX_HTTPS=x"} }}
	err := m.Run(t.Context(), []string{"doctor", "--node", "attic", "--data", dir, "--server", "nats://127.0.0.1:1",
		"--hosts", filepath.Join(t.TempDir(), "hosts"), "--env-file", envFile, "--json"})
	if err != nil {
		t.Fatalf("doctor: %v\n%s", err, stdout.String())
	}
	var rep doctor.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, stdout.String())
	}
	for _, c := range rep.Checks {
		if c.Name != "variables" {
			continue
		}
		if c.Status != doctor.Warn || !strings.Contains(c.Message, "MESHBOX_NAT in "+envFile+" is ignored; did you mean MESHBOX_NATS?") ||
			!strings.Contains(c.Message, "MESHBOX_HTTPS in the environment is ignored; did you mean MESHBOX_HTTP?") {
			t.Errorf("variables: got %s %q, want a warning naming both, with the names meant", c.Status, c.Message)
		}
		return
	}
	t.Errorf("doctor ran no variables check: %+v", rep.Checks)
}
