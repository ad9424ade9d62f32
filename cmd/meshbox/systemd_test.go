package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSdNotify sends to a real datagram socket, by path and in the
// abstract namespace, and does nothing without NOTIFY_SOCKET.
func TestSdNotify(t *testing.T) {
	for _, name := range []string{filepath.Join(t.TempDir(), "notify"), "@meshbox-test-" + strings.ReplaceAll(t.Name(), "/", "-")} {
		addr := name
		if addr[0] == '@' {
			addr = "\x00" + addr[1:]
		}
		l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		env := func(k string) string {
			if k == "NOTIFY_SOCKET" {
				return name
			}
			return ""
		}
		if err := sdNotify(env, "READY=1"); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		buf := make([]byte, 64)
		_ = l.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := l.Read(buf)
		if err != nil || string(buf[:n]) != "READY=1" {
			t.Errorf("%s: got %q, %v; want READY=1", name, buf[:n], err)
		}
		l.Close()
	}
	if err := sdNotify(func(string) string { return "" }, "READY=1"); err != nil {
		t.Errorf("without NOTIFY_SOCKET: %v, want nothing done", err)
	}
}

// TestJournalPriorities: under journald each record starts with its
// syslog priority, in text and JSON, with attributes and groups.
func TestJournalPriorities(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		var buf bytes.Buffer
		l := newLogger(&buf, "debug", format, true).With("node", "attic").WithGroup("g")
		l.Debug("d")
		l.Info("i")
		l.Warn("w", "k", "v")
		l.Error("e")
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		want := []string{"<7>", "<6>", "<4>", "<3>"}
		if len(lines) != len(want) {
			t.Fatalf("%s: %d lines, want %d:\n%s", format, len(lines), len(want), buf.String())
		}
		for i, l := range lines {
			if !strings.HasPrefix(l, want[i]) || !strings.Contains(l, "attic") {
				t.Errorf("%s line %d: %q, want it to start with %s and carry node=attic", format, i, l, want[i])
			}
		}
	}
	var buf bytes.Buffer
	newLogger(&buf, "info", "text", false).Warn("w")
	if strings.HasPrefix(buf.String(), "<") {
		t.Errorf("not under journald: %q, want no priority prefix", buf.String())
	}
}

// TestUnderJournal: only the stream JOURNAL_STREAM names is journald's.
func TestUnderJournal(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "stream")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	id := streamID(f)
	if id == "" {
		t.Fatal("no device:inode for a file")
	}
	if !underJournal(func(string) string { return id }, f) {
		t.Error("the stream JOURNAL_STREAM names: not taken as journald's")
	}
	if underJournal(func(string) string { return "1:2" }, f) || underJournal(func(string) string { return "" }, f) {
		t.Error("another stream, or none named: taken as journald's")
	}
}
