package localnats

import (
	"errors"
	"log/slog"
	"maps"
	"sync"
	"syscall"
	"time"

	"github.com/meshbox/meshbox/internal/backoff"
)

// Causes of a failed accept on the MQTT door's listener, as the node
// counts them (MQTTAcceptErrors). The door goes on accepting after each,
// a short pause later.
const (
	AcceptFDLimit  = "fd_limit"  // the process or the system is out of file descriptors (EMFILE, ENFILE)
	AcceptNoMemory = "no_memory" // the kernel is out of buffers or memory (ENOBUFS, ENOMEM)
	AcceptOther    = "other"     // any other error of the listener
)

// acceptRetry is the door's pause after failed accepts (the node's one
// retry schedule, internal/backoff): a listener out of file descriptors
// fails again at once until one is freed, so the pause grows from 10 ms
// while the failures go on, to at most half a second (a close waits for
// the pause in progress), and starts again after an accept succeeds.
var acceptRetry = backoff.Policy{Min: 10 * time.Millisecond, Max: 500 * time.Millisecond}

// acceptLogEvery is how often the door logs a cause of failed accepts
// that goes on: its first failure at once, then at most one line per
// cause in this time, with the failures since the last line.
const acceptLogEvery = time.Minute

// acceptCause names the cause of a failed accept.
func acceptCause(err error) string {
	switch {
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return AcceptFDLimit
	case errors.Is(err, syscall.ENOBUFS), errors.Is(err, syscall.ENOMEM):
		return AcceptNoMemory
	}
	return AcceptOther
}

// acceptErrors counts the door's failed accepts by cause and logs each
// cause at most once per acceptLogEvery. Its methods are safe for
// concurrent use.
type acceptErrors struct {
	log *slog.Logger
	now func() time.Time // time.Now; a test's clock

	mu     sync.Mutex
	counts map[string]uint64
	logged map[string]time.Time // when each cause was last logged
	since  map[string]uint64    // failures of each cause not yet in a log line
}

func newAcceptErrors(log *slog.Logger) *acceptErrors {
	return &acceptErrors{log: log, now: time.Now, counts: map[string]uint64{}, logged: map[string]time.Time{}, since: map[string]uint64{}}
}

// note counts a failed accept and logs it when its cause was not logged
// within acceptLogEvery.
func (a *acceptErrors) note(err error) {
	cause := acceptCause(err)
	now := a.now()
	a.mu.Lock()
	a.counts[cause]++
	a.since[cause]++
	last, seen := a.logged[cause]
	if seen && now.Sub(last) < acceptLogEvery {
		a.mu.Unlock()
		return
	}
	n, total := a.since[cause], a.counts[cause]
	a.logged[cause], a.since[cause] = now, 0
	a.mu.Unlock()
	a.log.Error("MQTT listener: accepting a device's connection failed; the door tries again (logged at most once a minute per cause; counted in meshbox_mqtt_accept_errors_total)",
		"cause", cause, "failures", n, "total", total, "err", err)
}

// snapshot returns the failed accepts by cause.
func (a *acceptErrors) snapshot() map[string]uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.counts)
}

// MQTTAcceptErrors counts the MQTT listener's failed accepts by cause
// (AcceptFDLimit, ...); nil without an MQTT listener.
func (n *Server) MQTTAcceptErrors() map[string]uint64 {
	if n.door == nil {
		return nil
	}
	return n.door.acceptErrs.snapshot()
}
