package redact

import (
	"context"
	"log/slog"
)

// Handler hides secrets in every record before next sees it: the
// message and string attributes go through Text, and the value of an
// attribute whose key names a secret (Key) becomes Mask (a group's
// attributes are looked at one by one). Values that
// redact themselves (slog.LogValuer) are resolved first. Records without
// "://" and without secret-looking keys cost one scan of each string.
type Handler struct{ next slog.Handler }

// NewHandler wraps next.
func NewHandler(next slog.Handler) *Handler { return &Handler{next: next} }

// Enabled reports whether next handles level.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// Handle passes a redacted copy of r to next.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, Text(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

// WithAttrs redacts attrs once, for every record.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		clean[i] = attr(a)
	}
	return &Handler{next: h.next.WithAttrs(clean)}
}

// WithGroup opens a group on next.
func (h *Handler) WithGroup(name string) slog.Handler { return &Handler{next: h.next.WithGroup(name)} }

// attr returns a with its secrets hidden.
func attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	if Key(a.Key) && v.Kind() != slog.KindGroup && !(v.Kind() == slog.KindString && v.String() == "") {
		return slog.String(a.Key, Mask)
	}
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, Text(v.String()))
	case slog.KindGroup:
		g := v.Group()
		clean := make([]any, len(g))
		for i, ga := range g {
			clean[i] = attr(ga)
		}
		return slog.Group(a.Key, clean...)
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			return slog.String(a.Key, Text(err.Error()))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
