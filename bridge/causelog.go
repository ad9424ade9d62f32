package bridge

import "sync"

// Every refusal the bridge makes is counted in a metric and logged once
// per cause (forged senders, replays, unsealable messages, local clients'
// refusals): a causeLog remembers the causes already logged. Keys may hold
// what an attacker chooses (a broker user, a key id, an inbox), so it
// remembers at most maxLoggedCauses; past them no new cause is logged, and
// the metrics still count every refusal.

// maxLoggedCauses bounds the keys a causeLog remembers.
const maxLoggedCauses = 256

// causeLog remembers the keys already logged. Its zero value is ready;
// safe for concurrent use.
type causeLog struct {
	mu   sync.Mutex
	seen map[string]bool
}

// first reports whether key is logged for the first time; past
// maxLoggedCauses keys, none is.
func (l *causeLog) first(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[key] || len(l.seen) >= maxLoggedCauses {
		return false
	}
	if l.seen == nil {
		l.seen = map[string]bool{}
	}
	l.seen[key] = true
	return true
}
