package main

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"
)

// meshbox version prints the binary's version, commit, build date, Go
// version and architecture, also when no node answers.
func TestVersionCommand(t *testing.T) {
	c := cli{}
	out := c.ok(t, "version", "--server", "nats://127.0.0.1:1")
	arch := runtime.GOOS + "/" + runtime.GOARCH
	for _, want := range []string{"meshbox ", "\n  commit ", "\n  built ", "\n  go ", runtime.Version(), "\n  arch ", arch, "node: cannot reach"} {
		if !strings.Contains(out, want) {
			t.Errorf("meshbox version: output lacks %q:\n%s", want, out)
		}
	}
	out = c.ok(t, "version", "--json", "--server", "nats://127.0.0.1:1")
	var got struct {
		Client struct {
			Version, Go, Arch string
		}
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("meshbox version --json: %v\n%s", err, out)
	}
	if got.Client.Version == "" || got.Client.Go != runtime.Version() || got.Client.Arch != arch {
		t.Errorf("meshbox version --json: got %+v, want a version, %s and %s", got.Client, runtime.Version(), arch)
	}
}
