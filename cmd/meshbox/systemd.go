package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
)

// This file is what the node tells systemd when it runs as a service:
// readiness and stopping through sd_notify (the unit is Type=notify), and
// each log record's syslog priority as journald reads it from a line's
// "<N>" prefix (so `journalctl -p warning -u meshbox` shows warnings and
// errors only). Both are small enough to write here rather than take a
// library: a datagram to $NOTIFY_SOCKET, and a prefix.

// sdNotify sends state ("READY=1", "STOPPING=1") to the service manager
// when the process runs under one ($NOTIFY_SOCKET set); otherwise it does
// nothing. A socket name starting with @ is in the abstract namespace.
func sdNotify(getenv func(string) string, state string) error {
	addr := getenv("NOTIFY_SOCKET")
	if addr == "" {
		return nil
	}
	if addr[0] == '@' {
		addr = "\x00" + addr[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = conn.Write([]byte(state))
	return err
}

// underJournal reports whether w is the stream journald reads: systemd
// sets $JOURNAL_STREAM to that stream's device and inode.
func underJournal(getenv func(string) string, w io.Writer) bool {
	js := getenv("JOURNAL_STREAM")
	if js == "" {
		return false
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	return streamID(f) == js
}

// priorityHandler prefixes each record with its syslog priority, <3>
// (error) to <7> (debug), for journald.
type priorityHandler struct {
	inner slog.Handler
	out   *priorityWriter
}

// priorityWriter writes each record (one Write per record, as slog's
// handlers do) after the prefix its handler set, under mu.
type priorityWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
}

func (p *priorityWriter) Write(b []byte) (int, error) {
	if _, err := io.WriteString(p.w, p.prefix); err != nil {
		return 0, err
	}
	return p.w.Write(b)
}

// newPriorityHandler returns a handler that writes to w through newInner
// with each record's syslog priority in front.
func newPriorityHandler(w io.Writer, newInner func(io.Writer) slog.Handler) slog.Handler {
	out := &priorityWriter{w: w}
	return &priorityHandler{inner: newInner(out), out: out}
}

func (h *priorityHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *priorityHandler) Handle(ctx context.Context, r slog.Record) error {
	h.out.mu.Lock()
	defer h.out.mu.Unlock()
	h.out.prefix = syslogPriority(r.Level)
	return h.inner.Handle(ctx, r)
}

func (h *priorityHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &priorityHandler{inner: h.inner.WithAttrs(as), out: h.out}
}

func (h *priorityHandler) WithGroup(name string) slog.Handler {
	return &priorityHandler{inner: h.inner.WithGroup(name), out: h.out}
}

// syslogPriority is the journald prefix of a level: err, warning, info,
// debug.
func syslogPriority(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "<3>"
	case l >= slog.LevelWarn:
		return "<4>"
	case l >= slog.LevelInfo:
		return "<6>"
	}
	return "<7>"
}
