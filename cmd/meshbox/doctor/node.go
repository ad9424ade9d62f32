package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/cache"
)

// checkNode asks the running node for its status on its NATS API.
func (d *Doctor) checkNode(ctx context.Context) Check {
	const name = "node"
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	if d.askStatus == nil {
		return warn(name, "pass --server to reach the running node", "no way to ask the running node")
	}
	st, err := d.askStatus(ctx)
	if err != nil {
		return warn(name, "start it (systemctl start meshbox, or meshbox run); pass --server if it listens elsewhere",
			"no node answers at %s", appliance.RedactURL(d.server))
	}
	d.status = &st
	msg := fmt.Sprintf("%s is running meshbox %s at %s", st.Node, st.Version, appliance.RedactURL(d.server))
	if st.Broker.State != "" {
		msg += ", broker " + st.Broker.State
	}
	if n := st.Node; n != "" && n != d.cfg.Node {
		return warn(name, "pass --node (or MESHBOX_NODE) as the node runs with", "%s; it is not %q, the node this configuration names", msg, d.cfg.Node)
	}
	if len(st.Problems) > 0 {
		// The node's own words: each names its cause and where to fix it.
		return fail(name, "fix what the node names; meshbox status lists it too", "%s; what keeps it from its work: %s", msg, strings.Join(st.Problems, "; "))
	}
	return ok(name, "%s", msg)
}

// checkCache reads the cached bindings, or, while the node runs and holds
// the file, asks the node how old its bindings are.
func (d *Doctor) checkCache(context.Context) Check {
	const name = "bindings cache"
	path := filepath.Join(d.cfg.DataDir, "cache.db")
	maxAge := d.cfg.Cache.MaxAge.D()
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		if d.cfg.DB == "" {
			return ok(name, "no cache file: a standalone node needs none")
		}
		return warn(name, "start the node once while the database is reachable",
			"no cache file at %s: if the database is away when the node starts, it starts without bindings", path)
	}
	store, err := cache.Open(path, cache.StoreOptions{ReadOnly: true, LockTimeout: 300 * time.Millisecond})
	if errors.Is(err, cache.ErrLocked) {
		return d.cacheFromNode(name, maxAge)
	}
	if errors.Is(err, cache.ErrCorrupt) {
		return fail(name, "the node sets a damaged file aside and rebuilds it from the database when it starts", "%s is damaged: %v", path, err)
	}
	if err != nil {
		return fail(name, "", "%s: %v", path, err)
	}
	defer store.Close()
	snap, err := store.Latest()
	if errors.Is(err, cache.ErrNoSnapshot) {
		if d.cfg.DB == "" {
			return ok(name, "empty: a standalone node needs none")
		}
		return warn(name, "start the node once while the database is reachable", "%s holds no bindings yet", path)
	}
	if err != nil {
		return fail(name, "", "%s: %v", path, err)
	}
	d.snap = &snap
	age := d.now().Sub(snap.FetchedAt).Round(time.Second)
	msg := fmt.Sprintf("revision %d for node %s, fetched %s ago from %s", snap.Revision, snap.Bindings.Node, age, snap.Source)
	if snap.Bindings.Node != d.cfg.Node {
		return warn(name, "pass --node as the node runs with", "%s: the cache is for another node than %q", msg, d.cfg.Node)
	}
	if maxAge > 0 && age > maxAge {
		return warn(name, "the node refreshes them once the database answers; check the database check below",
			"%s: older than cache.max_age (%s)", msg, maxAge)
	}
	return ok(name, "%s", msg)
}

// cacheFromNode judges the bindings from the running node's status.
func (d *Doctor) cacheFromNode(name string, maxAge time.Duration) Check {
	if d.status == nil {
		return warn(name, "another meshbox process holds the data directory; pass --server to reach it",
			"the cache file is in use, and no node answers at %s", appliance.RedactURL(d.server))
	}
	bs := d.status.Bindings
	src := bs.Source
	age := time.Duration(bs.AgeSeconds) * time.Second
	msg := "the running node holds the cache"
	if src != cache.SourceNone {
		msg = fmt.Sprintf("the running node holds the cache; its bindings come from %s, revision %d, age %s", src, bs.Revision, age)
	}
	if src == cache.SourceNone && d.cfg.DB == "" {
		return ok(name, "%s: it has no bindings, and a standalone node needs none", msg)
	}
	if w := bs.Warning; w != "" {
		return warn(name, "see the bindings part of meshbox status", "%s: %s", msg, w)
	}
	if src == cache.SourceCache {
		return warn(name, "the node returns to the database by itself once it answers; check the database check below",
			"%s: the node runs from its cache, the mesh database does not answer it", msg)
	}
	if src == cache.SourceNone {
		return warn(name, "see the bindings part of meshbox status", "%s: it has no bindings", msg)
	}
	if maxAge > 0 && age > maxAge {
		return warn(name, "", "%s: older than cache.max_age (%s)", msg, maxAge)
	}
	return ok(name, "%s", msg)
}
