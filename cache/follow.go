package cache

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/meshbox/meshbox/internal/backoff"
)

// Following the database: the loop that reloads on notification, retry
// and refresh, and applying what it loaded.

// watch runs Source.Watch until ctx is done.
func (m *Manager) watch(ctx context.Context) {
	changed := func() {
		select {
		case m.kick <- struct{}{}:
		default:
		}
	}
	lost := func(err error) { m.setDisconnected(err) }
	_ = m.cfg.Source.Watch(ctx, changed, lost) // returns only when ctx is done
}

// run performs every load and applies every change until ctx is done.
// Between loads it sleeps until the next retry, the next refresh, or the
// moment the bindings pass MaxAge, whichever comes first.
//
// pending, when not nil, delivers the first load, which missed Start's
// LoadTimeout: no reload starts before it ends.
func (m *Manager) run(ctx context.Context, retrySoon bool, pending <-chan loadResult) {
	// Jittered, so that nodes that lost the database together do not all
	// come back to it at the same instant.
	pause := backoff.Policy{Min: m.cfg.RetryInterval, Max: m.cfg.MaxRetryInterval}
	failures := 0
	kicked := false
	retry := time.NewTimer(m.cfg.RetryInterval)
	if !retrySoon || pending != nil {
		retry.Stop()
	}
	defer retry.Stop()
	// The refresh is jittered too: nodes that came back together do not
	// refresh together ever after.
	refreshDelay := func() time.Duration {
		return m.cfg.RefreshInterval - rand.N(m.cfg.RefreshInterval/5+1)
	}
	refresh := time.NewTimer(refreshDelay())
	defer refresh.Stop()
	// spread is the random wait between a notification and its reload;
	// notifications during the wait join it (the reload reads the newest).
	spread := time.NewTimer(0)
	spread.Stop()
	defer spread.Stop()
	spreading := false
	stale := time.NewTimer(0)
	defer stale.Stop()
	m.resetAgeTimer(stale)
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case r := <-pending:
			pending = nil
			err = r.err
			if err == nil {
				m.apply(r.snap)
			} else if ctx.Err() == nil {
				m.metrics.loadErrors.Inc()
				m.setDisconnected(err)
			}
			m.checkAge()
			m.resetAgeTimer(stale)
			if err == nil {
				refresh.Reset(refreshDelay())
				if kicked {
					retry.Reset(0) // a change notified while it ran
				}
				continue
			}
			if ctx.Err() != nil {
				return
			}
			failures++
			retry.Reset(pause.Delay(failures))
			continue
		case <-stale.C:
			m.checkAge()
			m.resetAgeTimer(stale)
			continue
		case <-m.aging:
			m.resetAgeTimer(stale)
			continue
		case <-m.kick:
			if pending != nil {
				kicked = true // reload once the first load has ended
				continue
			}
			if spreading {
				continue
			}
			if d := m.notifyDelay(); d > 0 {
				spreading = true
				spread.Reset(d)
				continue
			}
		case <-spread.C:
			spreading = false
		case <-retry.C:
		case <-refresh.C:
		}
		if pending != nil {
			continue // the first load is still under way
		}
		err = m.reload(ctx)
		m.checkAge() // a load may end the aging, or start it
		m.resetAgeTimer(stale)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			retry.Reset(pause.Delay(failures))
			continue
		}
		failures = 0
		retry.Stop()
		refresh.Reset(refreshDelay())
	}
}

// notifyDelay is a random wait in [0, spread), where the spread grows
// with the node records in the bindings in use (NotifyDelayPerNode each)
// up to MaxNotifyDelay.
func (m *Manager) notifyDelay() time.Duration {
	m.mu.Lock()
	nodes := len(m.cur.Bindings.Nodes)
	m.mu.Unlock()
	spread := min(time.Duration(nodes)*NotifyDelayPerNode, m.cfg.MaxNotifyDelay)
	if spread <= 0 {
		return 0
	}
	return rand.N(spread)
}

// reload loads from the source and applies the result. When the source
// can read the revision alone and it is the one already live from the
// database, the load is skipped: the bindings are confirmed as they are.
func (m *Manager) reload(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, m.cfg.ReloadTimeout)
	defer cancel()
	if snap, ok := m.sameRevision(lctx); ok {
		m.metrics.revisionChecks.Inc()
		m.apply(snap)
		return nil
	}
	snap, err := m.cfg.Source.Load(lctx, m.cfg.Node)
	if err != nil {
		if ctx.Err() == nil {
			m.metrics.loadErrors.Inc()
			m.setDisconnected(err)
		}
		return err
	}
	m.apply(snap)
	return nil
}

// sameRevision reads the revision alone (RevisionSource) and, when it is
// the revision of the bindings live from the database, returns them
// confirmed now. Any error means "load": the load reports it.
func (m *Manager) sameRevision(ctx context.Context) (Snapshot, bool) {
	rs, ok := m.cfg.Source.(RevisionSource)
	if !ok {
		return Snapshot{}, false
	}
	m.mu.Lock()
	cur, live := m.cur, m.have && m.source == SourceDB && m.db == DBConnected
	m.mu.Unlock()
	if !live {
		return Snapshot{}, false
	}
	rev, err := rs.Revision(ctx)
	if err != nil || rev != cur.Revision {
		return Snapshot{}, false
	}
	cur.FetchedAt = time.Now().UTC()
	return cur, true
}

// setDisconnected records a failed load or a lost connection; it logs only
// when the state changes.
func (m *Manager) setDisconnected(err error) {
	m.mu.Lock()
	was := m.db
	m.db = DBDisconnected
	m.lastErr = err.Error()
	m.noteNewerLocked(err)
	since := m.verifiedAt
	m.mu.Unlock()
	m.metrics.dbUp.Set(0)
	select { // the bindings age from now: the run loop sets its age timer
	case m.aging <- struct{}{}:
	default:
	}
	if was == DBConnected {
		m.log.Warn("lost the mesh database; bindings now age", "err", err, "confirmed_at", since)
	}
}

// apply stores a snapshot just loaded from the database, then installs
// it. Only one goroutine applies at a time (Start, then run).
func (m *Manager) apply(snap Snapshot) {
	now := time.Now()
	m.mu.Lock()
	prev, had, prevSource, wasDB := m.cur, m.have, m.source, m.db
	m.mu.Unlock()
	action := chooseReload(prev, had, snap)
	var storeErr error
	if action != reloadUnchanged || wasDB != DBConnected || prevSource != SourceDB {
		storeErr = m.putSnapshot(snap)
	}

	m.mu.Lock()
	m.db = DBConnected
	m.lastErr = ""
	m.newer = ""
	if storeErr != nil {
		m.lastErr = storeErr.Error()
	}
	m.verifiedAt = snap.FetchedAt
	m.source = SourceDB
	if action != reloadApply {
		m.cur.Revision, m.cur.FetchedAt, m.cur.Source = snap.Revision, snap.FetchedAt, snap.Source
		m.mu.Unlock()
		m.metrics.applied(snap, SourceDB, true)
		if wasDB != DBConnected || prevSource != SourceDB {
			m.log.Info("mesh database reachable; bindings unchanged", "snapshot", snap)
		}
		return
	}
	// A live change, or a divergence found when the database came back.
	reconnect := prevSource != SourceDB || wasDB != DBConnected
	d := Diff(prev.Bindings, snap.Bindings)
	if had {
		m.report = &DivergenceReport{At: now, FromRevision: prev.Revision, ToRevision: snap.Revision,
			FromSource: prevSource, OnReconnect: reconnect, Summary: d.Summary(), Changes: d}
	}
	m.cur, m.have = snap, true
	listeners := slices.Clone(m.listeners)
	m.mu.Unlock()

	m.metrics.applied(snap, SourceDB, true)
	m.metrics.changes.Inc()
	switch {
	case !had:
		m.log.Info("bindings loaded from the database", "snapshot", snap, "bindings", snap.Bindings)
	case reconnect:
		m.metrics.divergences.Inc()
		m.log.Warn("mesh database reachable again and ahead of the bindings in use; applying",
			"from_revision", prev.Revision, "to_revision", snap.Revision, "divergence", d)
	default:
		m.log.Info("bindings changed; applying",
			"from_revision", prev.Revision, "to_revision", snap.Revision, "divergence", d)
	}
	for _, fn := range listeners {
		fn(snap, d)
	}
}

// putSnapshot writes snap to the cache; a failure is counted, logged and
// returned for the status.
func (m *Manager) putSnapshot(snap Snapshot) error {
	err := m.cfg.Store.Put(snap)
	if err != nil {
		m.metrics.cacheErrors.Inc()
		m.log.Error("could not write bindings to the cache", "err", err)
	}
	return err
}

// storeSnapshot writes snap to the cache; a failure is logged and shown.
func (m *Manager) storeSnapshot(snap Snapshot) {
	if err := m.cfg.Store.Put(snap); err != nil {
		m.metrics.cacheErrors.Inc()
		m.mu.Lock()
		m.lastErr = err.Error()
		m.mu.Unlock()
		m.log.Error("could not write bindings to the cache", "err", err)
	}
}

// noteNewerLocked records a load refused because the database's schema is
// newer than this binary (ErrSourceNewer), logging it when it starts: the
// node keeps its bindings (from the cache) and says so in its warning.
func (m *Manager) noteNewerLocked(err error) {
	if !errors.Is(err, ErrSourceNewer) {
		return
	}
	if m.newer == "" {
		m.log.Warn("mesh database schema is newer than this meshbox; running from cached bindings until meshbox is upgraded", "err", err)
	}
	m.newer = err.Error()
}
