package e2e

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// meshStatusJSON is what `meshbox mesh status --json` prints.
type meshStatusJSON struct {
	Node  string `json:"node"`
	OK    bool   `json:"ok"`
	Nodes []struct {
		Name    string `json:"name"`
		State   string `json:"state"`
		Problem string `json:"problem"`
		Health  *struct {
			State   string   `json:"state"`
			Broker  string   `json:"broker"`
			Failing []string `json:"failing"`
		} `json:"health"`
	} `json:"nodes"`
}

// TestMeshStatusAtAGlance: each node shares its health with its peers on
// discovery; `meshbox mesh status` on one node shows every node, exits 0
// while all are ok and 1 once one fails (a module beta cannot start, then
// beta gone); `meshbox nodes` and the status page (in headless Chromium)
// show the peer's health too.
func TestMeshStatusAtAGlance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker, a database and two nodes")
	}
	alpha, beta, db := twoNodeMesh(t)
	creds := filepath.Join(alpha.DataDir(), programs.AdminFile)
	status := func() (int, meshStatusJSON, string) {
		code, out, errOut := cli(t, "mesh", "status", "--json", "--server", alpha.NATSURL(), "--creds", creds)
		var ms meshStatusJSON
		if err := json.Unmarshal([]byte(out), &ms); err != nil {
			t.Fatalf("mesh status --json: exit %d, not JSON (%v): %s%s", code, err, out, errOut)
		}
		return code, ms, errOut
	}
	peerOf := func(ms meshStatusJSON, name string) (state, health, problem string, failing []string) {
		for _, n := range ms.Nodes {
			if n.Name == name {
				if n.Health != nil {
					health, failing = n.Health.State, n.Health.Failing
				}
				return n.State, health, n.Problem, failing
			}
		}
		return "", "", "", nil
	}

	// All ok: exit 0, a line per node.
	var code int
	var ms meshStatusJSON
	meshtest.WaitFor(t, 30*time.Second, "mesh status ok with both nodes", func() bool {
		code, ms, _ = status()
		_, h, _, _ := peerOf(ms, "beta")
		return code == 0 && ms.OK && len(ms.Nodes) == 2 && h == "ok"
	})
	code, out, errOut := cli(t, "mesh", "status", "--server", alpha.NATSURL(), "--creds", creds)
	if code != 0 || !regexp.MustCompile(`(?m)^beta\s+up\s+ok\s+connected\s+db`).MatchString(out) || !strings.Contains(out, "all 2 nodes ok") {
		t.Errorf("mesh status, all ok: exit %d:\n%s%s", code, out, errOut)
	}

	// Beta fails: a module it cannot start. Alpha hears it from beta.
	mesh(t, db, "assign", "beta", "ghost")
	meshtest.WaitFor(t, 60*time.Second, "alpha's mesh status shows beta failing", func() bool {
		code, ms, _ = status()
		_, h, _, failing := peerOf(ms, "beta")
		return h == "failing" && len(failing) == 1 && failing[0] == "ghost"
	})
	if code != 1 || ms.OK {
		t.Errorf("mesh status with beta failing: exit %d ok %v, want exit 1", code, ms.OK)
	}
	if _, _, problem, _ := peerOf(ms, "alpha"); problem != "" {
		t.Errorf("alpha itself: problem %q, want none (the control)", problem)
	}
	code, out, _ = cli(t, "mesh", "status", "--server", alpha.NATSURL(), "--creds", creds)
	if code != 1 || !regexp.MustCompile(`(?m)^beta\s+up\s+failing\s.*modules failing: ghost`).MatchString(out) {
		t.Errorf("mesh status with beta failing: exit %d:\n%s", code, out)
	}
	if _, out, _ := cli(t, "nodes", "--server", alpha.NATSURL(), "--creds", creds); !regexp.MustCompile(`(?m)^beta\s+up\s+failing\s`).MatchString(out) {
		t.Errorf("meshbox nodes on alpha does not show beta failing:\n%s", out)
	}
	page := renderPage(t, alpha.HTTPURL()+"/")
	if !regexp.MustCompile(`data-peer="beta".*?data-state="failing".*?modules failing: ghost`).MatchString(page.dom) {
		t.Errorf("alpha's status page does not show beta failing with its module:\n%s", tail(page.dom, 40))
	}

	// Beta gone: its line says so.
	beta.Signal(syscall.SIGTERM)
	beta.Wait()
	meshtest.WaitFor(t, 60*time.Second, "alpha's mesh status shows beta gone", func() bool {
		code, ms, _ = status()
		st, _, problem, _ := peerOf(ms, "beta")
		return st == "gone" && strings.HasPrefix(problem, "gone")
	})
	if code != 1 {
		t.Errorf("mesh status with beta gone: exit %d, want 1", code)
	}
}
