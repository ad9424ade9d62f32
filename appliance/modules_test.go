package appliance

import (
	"strings"
	"testing"

	"github.com/meshbox/meshbox/appliance/programs"
)

// TestModuleProgram checks that every module name maps to a valid program
// name, and that names a program name cannot hold do not collide with
// their look-alikes.
func TestModuleProgram(t *testing.T) {
	seen := map[string]string{}
	for _, m := range []string{"backups", "a_b", "a.b", "a-b", "photo.resize.v2", strings.Repeat("x", 128), strings.Repeat("x", 127) + "y"} {
		p := moduleProgram(m)
		if err := programs.CheckName(p); err != nil {
			t.Errorf("module %q: program name %q: %v", m, p, err)
		}
		if other, ok := seen[p]; ok {
			t.Errorf("modules %q and %q share program name %q", other, m, p)
		}
		seen[p] = m
	}
	if got := moduleProgram("backups"); got != "module-backups" {
		t.Errorf("backups: got %q, want module-backups", got)
	}
}
