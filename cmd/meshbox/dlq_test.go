package main

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

// Bad dlq command lines are refused before the node is asked (no node
// listens on the --server given: asking it would fail differently).
func TestDlqArgs(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"erase", "orders"},
		{"list", "orders", "extra"},
		{"list", "bad stage"},
		{"show", "orders"},
		{"show", "orders", "id with space"},
		{"replay", "orders"},
		{"replay", "orders", "id-1", "--all"},
		{"replay", "--all"},
		{"purge"},
		{"purge", "orders", "--all"},
		{"purge", "a..b"},
	} {
		var out bytes.Buffer
		m := &Main{Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}
		err := m.Run(context.Background(), append([]string{"dlq", "--server", "nats://127.0.0.1:1"}, args...))
		var ue *usageError
		if !errors.As(err, &ue) {
			t.Errorf("dlq %v: got %v, want a usage error", args, err)
		}
	}
}
