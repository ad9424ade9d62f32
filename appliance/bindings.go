package appliance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/meshbox/meshbox/appliance/keys"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/prometheus/client_golang/prometheus"
)

// bindings is the node's bindings state: the versioned cache in the data
// directory (which also holds the directory's lock), the mesh database when
// one is configured, and the manager that keeps them in step.
type bindings struct {
	store   *cache.Store
	db      *meshdb.DB // nil without a database
	manager *cache.Manager
	// nodeKey is the node's key pair, loaded (or made) once with the
	// database: it opens the node's credential rows, and the key keeper
	// (package keys) uses it. Nil without a database.
	nodeKey *seal.NodeKey
}

// openBindings opens the cache and, with a database URL, the database, and
// starts the manager: it takes the database if it answers within
// cfg.Cache.LoadTimeout, else the newest cached snapshot. onChange is called
// after every applied change (on the manager's goroutine).
func openBindings(ctx context.Context, cfg Config, logger *slog.Logger, reg prometheus.Registerer, onChange func(cache.Snapshot, cache.Divergence)) (_ *bindings, err error) {
	b := &bindings{}
	defer func() {
		if err != nil {
			_ = b.close()
		}
	}()
	b.store, err = cache.Open(filepath.Join(cfg.DataDir, "cache.db"), cache.StoreOptions{Keep: cfg.Cache.Keep})
	if err != nil {
		if errors.Is(err, cache.ErrLocked) {
			return nil, fmt.Errorf("%w: %s", ErrDataDirInUse, cfg.DataDir)
		}
		return nil, fmt.Errorf("open cache: %w", err)
	}
	mc := cache.ManagerConfig{
		Node:          cfg.Node,
		Store:         b.store,
		LoadTimeout:   cfg.Cache.LoadTimeout.D(),
		RetryInterval: cfg.Cache.RetryInterval.D(),
		MaxAge:        cfg.Cache.MaxAge.D(),
		Logger:        logger,
		Metrics:       reg,
	}
	if cfg.DB != "" {
		// The node's key pair opens its credential rows sealed to it; the
		// key keeper (package keys) publishes its public half.
		key, err := keys.LoadNodeKey(cfg.DataDir, logger.With("component", "keys"))
		if err != nil {
			return nil, fmt.Errorf("keys: %w", err)
		}
		b.nodeKey = key
		b.db, err = meshdb.Open(ctx, string(cfg.DB), meshdb.Options{
			ConnectTimeout: max(cfg.Cache.LoadTimeout.D(), meshdb.DefaultConnectTimeout),
			Logger:         logger,
			NodeKey:        key,
		})
		if err != nil {
			return nil, err
		}
		// A rotation gave the node a database role of its own generation
		// (the role of its join token may be gone): log in with the newest
		// one the cache knows.
		if snap, err := b.store.Latest(); err == nil && snap.Bindings.Node == cfg.Node {
			if c := snap.Bindings.Broker; c != nil && c.DBRole != "" && c.DBRole != b.db.User() {
				b.db.UseLogin(c.DBRole, c.DBPassword.Reveal())
				logger.Info("database login: the role of the newest credential generation in the cache", "role", c.DBRole, "generation", c.Generation)
			}
		}
		mc.Source = b.db
	}
	b.manager, err = cache.NewManager(mc)
	if err != nil {
		return nil, err
	}
	if onChange != nil {
		b.manager.OnChange(onChange)
	}
	if err := b.manager.Start(ctx); err != nil {
		return nil, fmt.Errorf("bindings: %w", err)
	}
	return b, nil
}

// close stops the manager and closes the database and the cache.
func (b *bindings) close() error {
	var errs []error
	if b.manager != nil {
		errs = append(errs, b.manager.Close())
	}
	if b.db != nil {
		errs = append(errs, b.db.Close())
	}
	if b.store != nil {
		errs = append(errs, b.store.Close())
	}
	return errors.Join(errs...)
}
