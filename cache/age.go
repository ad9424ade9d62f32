package cache

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// The age of the bindings: the one timer set for the moment they pass
// MaxAge, and the warning.

// ageLoop logs the max-age warning when there is no database to follow:
// it sleeps until the cached bindings pass MaxAge, once.
func (m *Manager) ageLoop(ctx context.Context) {
	stale := time.NewTimer(0)
	defer stale.Stop()
	m.resetAgeTimer(stale)
	for {
		select {
		case <-ctx.Done():
			return
		case <-stale.C:
			m.checkAge()
			m.resetAgeTimer(stale)
		}
	}
}

// resetAgeTimer sets t to fire when the bindings in use pass MaxAge, or
// stops it when they cannot (no MaxAge, no bindings, confirmed by a
// connected database, or already past it).
func (m *Manager) resetAgeTimer(t *time.Timer) {
	m.mu.Lock()
	d, ok := m.untilStaleLocked(time.Now())
	m.mu.Unlock()
	if ok {
		t.Reset(d)
	} else {
		t.Stop()
	}
}

// untilStaleLocked is how long until the bindings in use pass MaxAge, and
// whether they will without a change of state. Caller holds mu.
func (m *Manager) untilStaleLocked(now time.Time) (time.Duration, bool) {
	if m.cfg.MaxAge <= 0 || m.stale || !m.have || (m.db == DBConnected && m.source == SourceDB) {
		return 0, false
	}
	// stale means age > MaxAge: the deadline lies just past it.
	return max(m.verifiedAt.Add(m.cfg.MaxAge+1).Sub(now), 0), true
}

// ageLocked is how long the bindings in use have gone unconfirmed.
// Caller holds mu.
func (m *Manager) ageLocked(now time.Time) time.Duration {
	if !m.have || (m.db == DBConnected && m.source == SourceDB) {
		return 0
	}
	return max(now.Sub(m.verifiedAt), 0)
}

func (m *Manager) checkAge() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checkAgeLocked(time.Now())
}

// checkAgeLocked updates the max-age warning and logs its transitions.
// Caller holds mu.
func (m *Manager) checkAgeLocked(now time.Time) {
	if m.cfg.MaxAge <= 0 {
		return
	}
	age := m.ageLocked(now)
	stale := age > m.cfg.MaxAge
	if stale == m.stale {
		return
	}
	m.stale = stale
	if stale {
		m.log.Warn("bindings older than the configured maximum age", "age", age.Round(time.Second),
			"max_age", m.cfg.MaxAge, "source", m.source, "db", m.db)
	} else {
		m.log.Info("bindings within the maximum age again", "source", m.source)
	}
}

// warningLocked composes Status.Warning. Caller holds mu.
func (m *Manager) warningLocked(now time.Time) string {
	var w []string
	if m.newer != "" {
		w = append(w, m.newer)
	}
	if !m.have {
		// A standalone node (no mesh database configured) has no bindings
		// by design: its status says so in source and db, not as a warning.
		if m.db != DBNone {
			w = append(w, "no bindings: neither the mesh database nor the cache could provide them")
		}
	} else {
		if m.stale {
			w = append(w, fmt.Sprintf("bindings are %s old, more than the maximum age %s",
				m.ageLocked(now).Round(time.Second), m.cfg.MaxAge))
		}
		if _, ok := m.cur.Bindings.NodeRecord(m.cfg.Node); !ok {
			w = append(w, fmt.Sprintf("node %q has no record in the mesh database", m.cfg.Node))
		}
	}
	return strings.Join(w, "; ")
}
