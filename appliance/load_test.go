package appliance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadEnvFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "meshbox.env")
	data := "# comment\n\nMESHBOX_NODE=attic\nMESHBOX_DB=\"postgres://u:p@db/mesh\"\nexport MESHBOX_LOG_LEVEL='debug'\n"
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	env, err := ReadEnvFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"MESHBOX_NODE": "attic", "MESHBOX_DB": "postgres://u:p@db/mesh", "MESHBOX_LOG_LEVEL": "debug"}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s: got %q, want %q", k, env[k], v)
		}
	}
	if err := os.WriteFile(path, []byte("MESHBOX_NODE attic\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadEnvFile(path); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("bad line: got %v, want an error naming line 1", err)
	}
}

// Each layer beats the one before: defaults, file, env file, environment,
// flags.
func TestLoadConfigLayers(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "meshbox.json")
	if err := os.WriteFile(file, []byte(`{"node": "file", "data": "/from/file", "nats": "127.0.0.1:1111", "http": "127.0.0.1:2222", "log": {"level": "debug"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	envFile := filepath.Join(dir, "meshbox.env")
	if err := os.WriteFile(envFile, []byte("MESHBOX_DATA=/from/envfile\nMESHBOX_NATS=127.0.0.1:3333\nMESHBOX_HTTP=127.0.0.1:4444\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"MESHBOX_NATS": "127.0.0.1:5555", "MESHBOX_HTTP": "127.0.0.1:6666", "MESHBOX_PPROF": "true"}
	cfg, err := LoadConfig(ConfigSources{
		File:    file,
		EnvFile: envFile,
		Getenv:  func(k string) string { return env[k] },
		Flags:   map[string]string{"http": "127.0.0.1:7777"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]string{
		"node":      {cfg.Node, "file"},
		"data":      {cfg.DataDir, "/from/envfile"},
		"nats":      {cfg.NATS, "127.0.0.1:5555"},
		"http":      {cfg.HTTP, "127.0.0.1:7777"},
		"log.level": {cfg.Log.Level, "debug"},
		"log.fmt":   {cfg.Log.Format, DefaultConfig().Log.Format},
	}
	for field, gw := range want {
		if gw[0] != gw[1] {
			t.Errorf("%s: got %q, want %q", field, gw[0], gw[1])
		}
	}
	if !cfg.Pprof {
		t.Error("pprof: got false, want true from MESHBOX_PPROF")
	}

	// MESHBOX_CONFIG names the file when no flag does.
	cfg, err = LoadConfig(ConfigSources{Getenv: func(k string) string {
		return map[string]string{"MESHBOX_CONFIG": file}[k]
	}})
	if err != nil || cfg.Node != "file" {
		t.Errorf("file from MESHBOX_CONFIG: got node %q, %v; want file", cfg.Node, err)
	}
}

func TestLoadConfigRejects(t *testing.T) {
	tests := []struct {
		name  string
		flags map[string]string
		want  string // in the error
	}{
		{"pprof on a public listener", map[string]string{"pprof": "true", "http": "0.0.0.0:7222"}, "pprof"},
		{"pprof without a listener", map[string]string{"pprof": "true", "http": "off"}, "pprof"},
		{"pprof not a bool", map[string]string{"pprof": "maybe"}, "--pprof"},
		{"bad node", map[string]string{"node": "bad name"}, "node"},
		{"unknown field", map[string]string{"colour": "blue"}, "colour"},
	}
	for _, tt := range tests {
		_, err := LoadConfig(ConfigSources{Flags: tt.flags})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want an error naming %s", tt.name, err, tt.want)
		}
	}
	if _, err := LoadConfig(ConfigSources{Flags: map[string]string{"pprof": "true", "http": "localhost:0"}}); err != nil {
		t.Errorf("pprof on localhost: got %v, want it accepted", err)
	}
}

// TestSettingSources: a message that says where to fix a setting names
// every way to set it, as the flags and variables define them.
func TestSettingSources(t *testing.T) {
	for _, tt := range []struct{ field, want string }{
		{"broker", "broker (config key broker, flag --broker, env MESHBOX_BROKER)"},
		{"db", "db (config key db, flag --db, env MESHBOX_DB)"},
		{"cache.max_age", "cache.max_age (config key cache.max_age)"},
	} {
		if got := SettingSources(tt.field); got != tt.want {
			t.Errorf("SettingSources(%q): got %q, want %q", tt.field, got, tt.want)
		}
	}
}
