package appliance

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteEnvFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "etc", "meshbox.env")
	vars := map[string]string{"MESHBOX_NODE": "cellar", "MESHBOX_DB": "postgres://r:p@db/mesh?sslmode=require"}
	if err := WriteEnvFile(path, "written by a test\nsecond line", vars, false); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode: got %v, want 0600", fi.Mode().Perm())
	}
	got, err := ReadEnvFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["MESHBOX_NODE"] != "cellar" || got["MESHBOX_DB"] != vars["MESHBOX_DB"] {
		t.Errorf("read back: got %v, want %v", got, vars)
	}
	cfg, err := LoadConfig(ConfigSources{EnvFile: path})
	if err != nil || cfg.Node != "cellar" || string(cfg.DB) != vars["MESHBOX_DB"] {
		t.Errorf("LoadConfig from the file: node %q db %v err %v", cfg.Node, cfg.DB, err)
	}
	if err := WriteEnvFile(path, "", vars, false); !errors.Is(err, ErrEnvFileExists) {
		t.Errorf("second write: got %v, want ErrEnvFileExists", err)
	}
	if err := CheckEnvFileWritable(path, false); !errors.Is(err, ErrEnvFileExists) {
		t.Errorf("check: got %v, want ErrEnvFileExists", err)
	}
	if err := WriteEnvFile(path, "", map[string]string{"MESHBOX_NODE": "other"}, true); err != nil {
		t.Fatalf("replace: %v", err)
	}
	if got, _ := ReadEnvFile(path); got["MESHBOX_NODE"] != "other" || got["MESHBOX_DB"] != "" {
		t.Errorf("after replace: got %v", got)
	}
	if err := WriteEnvFile(path, "", map[string]string{"X": "a\nMESHBOX_DB=evil"}, true); err == nil {
		t.Error("a value with a line break was written")
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the env file (no temporary files)", len(entries))
	}
}

// The Debian package installs the example configuration (comments only):
// meshbox join replaces it without --force, and refuses a file that sets
// something.
func TestWriteEnvFileReplacesCommentsOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "meshbox.env")
	example, err := os.ReadFile("../deploy/meshbox.env.example")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, example, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CheckEnvFileWritable(path, false); err != nil {
		t.Fatalf("check over the example: got %v, want nil", err)
	}
	if err := WriteEnvFile(path, "joined", map[string]string{"MESHBOX_NODE": "cellar"}, false); err != nil {
		t.Fatalf("write over the example: got %v, want nil", err)
	}
	if got, _ := ReadEnvFile(path); got["MESHBOX_NODE"] != "cellar" {
		t.Fatalf("after write: got %v", got)
	}
	if err := WriteEnvFile(path, "", map[string]string{"MESHBOX_NODE": "other"}, false); !errors.Is(err, ErrEnvFileExists) {
		t.Fatalf("write over a file that sets MESHBOX_NODE: got %v, want ErrEnvFileExists", err)
	}
}
