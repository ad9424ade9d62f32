package bridge

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// MaxLease and the dedupe policies are validated; an unset MaxLease is
// the larger of the default and CommandTimeout.
func TestLeaseAndDedupeConfig(t *testing.T) {
	base := func() Config {
		return Config{Node: "n", OutboxPath: filepath.Join(t.TempDir(), "outbox.db"),
			Dial: func(...nats.Option) (*nats.Conn, error) { return nil, nil }}
	}
	c := base()
	c.CommandTimeout = 20 * time.Minute
	if got := c.withDefaults().MaxLease; got != 20*time.Minute {
		t.Errorf("default MaxLease with a 20m CommandTimeout: got %s, want 20m", got)
	}
	if got := base().withDefaults().CompletedPath; filepath.Base(got) != "completed.db" {
		t.Errorf("default CompletedPath: got %q", got)
	}
	for _, tc := range []struct {
		name, want string
		edit       func(*Config)
	}{
		{"lease below timeout", "MaxLease", func(c *Config) { c.CommandTimeout = time.Minute; c.MaxLease = time.Second }},
		{"lease too long", "MaxLease", func(c *Config) { c.MaxLease = time.Hour }},
		{"dedupe bad stage", "Dedupe", func(c *Config) {
			c.Dedupe = map[string]DedupePolicy{"a b": {Window: time.Hour, MaxEntries: 1}}
		}},
		{"dedupe no window", "Dedupe", func(c *Config) { c.Dedupe = map[string]DedupePolicy{"s": {MaxEntries: 1}} }},
		{"dedupe no bound", "Dedupe", func(c *Config) { c.Dedupe = map[string]DedupePolicy{"s": {Window: time.Hour}} }},
	} {
		c := base()
		tc.edit(&c)
		err := c.withDefaults().validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
	c = base()
	c.Dedupe = map[string]DedupePolicy{"s": {Window: 24 * time.Hour, MaxEntries: 100000}}
	if err := c.withDefaults().validate(); err != nil {
		t.Errorf("a valid dedupe policy: %v", err)
	}
}

// A lease moves to CommandTimeout from the progress, never past MaxLease
// from the start, and never backwards.
func TestLeaseUntil(t *testing.T) {
	b := &Bridge{cfg: Config{CommandTimeout: 10 * time.Second, MaxLease: 30 * time.Second}}
	t0 := time.Now()
	if u, later := b.leaseUntil(t0, t0.Add(10*time.Second), t0.Add(5*time.Second)); !later || !u.Equal(t0.Add(15*time.Second)) {
		t.Errorf("progress at 5s: got %s %v, want 15s true", u.Sub(t0), later)
	}
	if u, later := b.leaseUntil(t0, t0.Add(25*time.Second), t0.Add(25*time.Second)); !later || !u.Equal(t0.Add(30*time.Second)) {
		t.Errorf("progress at 25s: got %s %v, want 30s (MaxLease) true", u.Sub(t0), later)
	}
	if _, later := b.leaseUntil(t0, t0.Add(30*time.Second), t0.Add(29*time.Second)); later {
		t.Error("progress at the maximum lease moved the deadline")
	}
}
