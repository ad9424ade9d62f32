package appliance

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// ErrorEntry is one recent warning or error, as shown in the status.
// Level is the level it was logged at (WARN or ERROR).
type ErrorEntry struct {
	At        time.Time `json:"at"`
	Level     string    `json:"level"`
	Component string    `json:"component,omitempty"`
	Message   string    `json:"message"`
	Detail    string    `json:"detail,omitempty"`
	condition string    // the standing condition it is about ("": none)
}

// conditionKey is the log attribute that ties a warning or an error to a
// standing condition that may end ("lacks content key k1"): once the
// condition ends (errorRing.end), the entries about it leave the status.
// The log keeps them.
const conditionKey = "condition"

// errorRing keeps the last warnings and errors logged by the node so that the
// status can show them. It is a slog.Handler that wraps the real one.
type errorRing struct {
	mu      sync.Mutex
	entries []ErrorEntry         // oldest first, at most max
	logged  map[loggedKey]uint64 // every entry ever added, by level and component (metrics.go)
	max     int
}

func newErrorRing(max int) *errorRing { return &errorRing{max: max} }

func (r *errorRing) add(e ErrorEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.entries) == r.max {
		copy(r.entries, r.entries[1:])
		r.entries = r.entries[:r.max-1]
	}
	r.entries = append(r.entries, e)
	if r.logged == nil {
		r.logged = make(map[loggedKey]uint64)
	}
	r.logged[loggedKey{e.Level, e.Component}]++
}

// end removes the entries about condition: it has ended.
func (r *errorRing) end(condition string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entries = slices.DeleteFunc(r.entries, func(e ErrorEntry) bool { return e.condition == condition })
}

// recent returns the entries, newest first.
func (r *errorRing) recent() []ErrorEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ErrorEntry, len(r.entries))
	for i, e := range r.entries {
		out[len(out)-1-i] = e
	}
	return out
}

// ringHandler passes every record on and keeps warnings and errors in ring.
type ringHandler struct {
	next      slog.Handler
	ring      *errorRing
	component string
}

func (h *ringHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || h.next.Enabled(ctx, l)
}

func (h *ringHandler) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Level >= slog.LevelWarn {
		e := ErrorEntry{At: rec.Time, Level: rec.Level.String(), Component: h.component, Message: rec.Message}
		rec.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "component":
				e.Component = a.Value.String()
			case "err", "error", "reason":
				e.Detail = a.Value.Resolve().String()
			case conditionKey:
				e.condition = a.Value.String()
			}
			return true
		})
		h.ring.add(e)
	}
	if h.next.Enabled(ctx, rec.Level) {
		return h.next.Handle(ctx, rec)
	}
	return nil
}

func (h *ringHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := h.component
	for _, a := range attrs {
		if a.Key == "component" {
			c = a.Value.String()
		}
	}
	return &ringHandler{next: h.next.WithAttrs(attrs), ring: h.ring, component: c}
}

func (h *ringHandler) WithGroup(name string) slog.Handler {
	return &ringHandler{next: h.next.WithGroup(name), ring: h.ring, component: h.component}
}
