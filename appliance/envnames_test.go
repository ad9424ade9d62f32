package appliance

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestUnknownEnvVars(t *testing.T) {
	envFile := filepath.Join(t.TempDir(), "meshbox.env")
	if err := os.WriteFile(envFile, []byte("MESHBOX_NAT=127.0.0.1:4333\nMESHBOX_DATA=/srv/mesh\nMESHBOX_OVERRIDE_SIZE=3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	environ := []string{"PATH=/bin", "MESHBOX_NODE=attic", "MESHBOX_LOGLEVEL=debug", "MESHBOX_FROBNICATE=1", "MESHBOX_GRANT_NAS=/x", "MESHBOX_SERVER=nats://h"}
	got, err := UnknownEnvVars(envFile, environ)
	if err != nil {
		t.Fatal(err)
	}
	want := []UnknownEnv{
		{Name: "MESHBOX_NAT", In: envFile, Nearest: "MESHBOX_NATS"},
		{Name: "MESHBOX_FROBNICATE", In: "the environment"},
		{Name: "MESHBOX_LOGLEVEL", In: "the environment", Nearest: "MESHBOX_LOG_LEVEL"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("[%d]: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if s := got[0].String(); !strings.Contains(s, "did you mean MESHBOX_NATS?") || !strings.Contains(s, envFile) {
		t.Errorf("got %q, want the file and the name meant", s)
	}
	if _, err := UnknownEnvVars(filepath.Join(t.TempDir(), "none.env"), nil); err == nil {
		t.Error("a missing env file: got no error")
	}
}

// TestEveryEnvVarIsKnown: each MESHBOX_* name meshbox's code spells out
// (outside tests) is one the unknown-variable check knows, so that a
// variable added to the code is never warned about as unknown.
func TestEveryEnvVarIsKnown(t *testing.T) {
	lit := regexp.MustCompile(`"(MESHBOX_[A-Z0-9_]*)"`)
	root := ".."
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testing" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range lit.FindAllStringSubmatch(string(src), -1) {
			name := m[1]
			if strings.HasSuffix(name, "_") { // a prefix
				continue
			}
			if !KnownEnvVar(name) {
				t.Errorf("%s: %s is not among the known variables (EnvVars, CommandEnvVars)", path, name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
