package doctor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/cache"
)

func TestDoctorModules(t *testing.T) {
	cat := t.TempDir()
	write := func(name, manifest string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(cat, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cat, name, "manifest.json"), []byte(manifest), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("good", `{"name": "good", "selections": {"stable": {"command": "x"}}}`)
	cfg := appliance.DefaultConfig()
	cfg.Modules.Dir = cat
	doc := New(Options{Config: cfg})

	if c := doc.checkModules(context.Background()); c.Status != OK || !strings.Contains(c.Message, "1 modules, every manifest valid") {
		t.Errorf("valid catalog: got %+v, want ok", c)
	}
	write("spare", `{"name": "spare"}`)
	if c := doc.checkModules(context.Background()); c.Status != Warn || !strings.Contains(c.Message, "spare/manifest.json: selections: required") {
		t.Errorf("a bad manifest nobody assigned: got %+v, want a warning naming file and field", c)
	}
	doc.snap = &cache.Snapshot{Bindings: cache.Bindings{Assignments: []cache.Assignment{
		{Module: "good", Selection: "nightly"}, {Module: "absent", Selection: "stable"}}}}
	c := doc.checkModules(context.Background())
	for _, want := range []string{`module good is assigned at selection "nightly", which its manifest lacks (it has stable)`,
		"module absent is assigned but not in the catalog"} {
		if c.Status != Fail || !strings.Contains(c.Message, want) {
			t.Errorf("assignments the catalog cannot run: got %+v, want a failure saying %q", c, want)
		}
	}
}
