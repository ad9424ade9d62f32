package appliance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
)

// bindings is the node's bindings state. Until the cache package is wired
// in, it only holds the data directory's lock.
type bindings struct {
	db *bolt.DB
}

func openBindings(ctx context.Context, cfg Config, logger *slog.Logger, reg prometheus.Registerer) (*bindings, error) {
	path := filepath.Join(cfg.DataDir, "cache.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("%w: %s", ErrDataDirInUse, cfg.DataDir)
		}
		return nil, fmt.Errorf("open cache: %w", err)
	}
	return &bindings{db: db}, nil
}

func (b *bindings) close() error { return b.db.Close() }
