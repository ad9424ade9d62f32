package meshtest

import (
	"context"
	"log/slog"
	"testing"

	"github.com/meshbox/meshbox/appliance"
)

// NodeConfig returns the configuration of a test node named name: NATS and
// HTTP on free loopback ports, a fresh data directory, quick retries.
func NodeConfig(tb testing.TB, name string) appliance.Config {
	tb.Helper()
	cfg := appliance.DefaultConfig()
	cfg.Node = name
	cfg.DataDir = tb.TempDir()
	cfg.NATS = "127.0.0.1:0"
	cfg.HTTP = "127.0.0.1:0"
	cfg.Log.Level = "debug"
	return cfg
}

// StartNode starts a node in this process and closes it in cleanup. Its log
// goes to tb.Log.
func StartNode(tb testing.TB, cfg appliance.Config) *appliance.Appliance {
	tb.Helper()
	logger := slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test_node", cfg.Node)
	a, err := appliance.New(cfg, logger)
	if err != nil {
		tb.Fatalf("node %s: %v", cfg.Node, err)
	}
	if err := a.Start(context.Background()); err != nil {
		_ = a.Close()
		tb.Fatalf("start node %s: %v", cfg.Node, err)
	}
	tb.Cleanup(func() {
		if err := a.Close(); err != nil {
			tb.Errorf("close node %s: %v", cfg.Node, err)
		}
	})
	return a
}

// tbWriter sends log lines to tb.Log, which keeps them with the test and
// prints them only when it fails (or with -v).
type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Helper()
	w.tb.Log(string(p[:len(p)-min(len(p), 1)]))
	return len(p), nil
}
