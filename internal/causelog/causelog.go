// Package causelog remembers which causes of a refusal were logged
// already, so that a node logs each cause once (forged senders, replays,
// messages that do not open, local clients' refusals) while its metrics
// count every refusal.
//
// Keys may hold what an attacker chooses (a broker user, a key id, an
// inbox), so a Log remembers at most Max keys; past them no new cause is
// logged.
package causelog

import "sync"

// Max bounds the keys a Log remembers.
const Max = 256

// Log remembers the keys already logged. Its zero value is ready; safe
// for concurrent use.
type Log struct {
	mu   sync.Mutex
	seen map[string]bool
}

// First reports whether key is logged for the first time; past Max keys,
// none is.
func (l *Log) First(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[key] || len(l.seen) >= Max {
		return false
	}
	if l.seen == nil {
		l.seen = map[string]bool{}
	}
	l.seen[key] = true
	return true
}

// Len returns how many keys the log remembers.
func (l *Log) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seen)
}
