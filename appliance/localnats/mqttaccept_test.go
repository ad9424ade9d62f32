package localnats

import (
	"bytes"
	"errors"
	"log/slog"
	"maps"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// failingListener fails its first accepts with errs, then accepts as
// its listener does.
type failingListener struct {
	net.Listener
	mu   sync.Mutex
	errs []error
}

func (l *failingListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		l.mu.Unlock()
		return nil, err
	}
	l.mu.Unlock()
	return l.Listener.Accept()
}

// syncBuffer is a log's output, safe for the door's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns the log's lines that contain s.
func (b *syncBuffer) lines(s string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, l := range strings.Split(b.buf.String(), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

func acceptErr(errno syscall.Errno) error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}
}

const acceptLogLine = "accepting a device's connection failed"

// The door's listener fails: out of file descriptors five times, out of
// buffers twice, and once otherwise. Each failure is counted under its
// cause, each cause is logged once (not once per retry), and a device
// connects through the door afterwards (the control).
func TestMQTTDoorAcceptErrors(t *testing.T) {
	n := startMQTTNode(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	for range 5 {
		errs = append(errs, acceptErr(syscall.EMFILE))
	}
	errs = append(errs, acceptErr(syscall.ENOBUFS), acceptErr(syscall.ENOBUFS), errors.New("accept: something else"))
	out := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(out, nil))
	// The node's door, on the failing listener.
	n.door.close()
	d := newMQTTDoor(&failingListener{Listener: ln, errs: errs}, nil, n.door.srv, n.door.inner, n.auth, newMQTTBounds(t.TempDir(), log), log)
	n.door = d
	d.start()

	want := map[string]uint64{AcceptFDLimit: 5, AcceptNoMemory: 2, AcceptOther: 1}
	deadline := time.Now().Add(10 * time.Second)
	for !maps.Equal(n.MQTTAcceptErrors(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("failed accepts counted: got %v, want %v", n.MQTTAcceptErrors(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A failure is counted before its line is written: wait for the
	// lines too.
	for len(out.lines(acceptLogLine)) < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	lines := out.lines(acceptLogLine)
	if len(lines) != 3 {
		t.Fatalf("got %d log lines of failed accepts, want 3 (one per cause):\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, cause := range []string{AcceptFDLimit, AcceptNoMemory, AcceptOther} {
		if n := len(out.lines("cause=" + cause)); n != 1 {
			t.Errorf("cause %s: got %d log lines, want 1", cause, n)
		}
	}

	// The control: a device connects through the door and gets a message.
	round, disconnect := doorRound(t, ln.Addr().String())
	defer disconnect()
	if err := round(); err != nil {
		t.Fatalf("a device through the door after its failed accepts: %v", err)
	}
	if got := n.MQTTAcceptErrors(); !maps.Equal(got, want) {
		t.Errorf("after the device connected: failed accepts %v, want %v", got, want)
	}
}

// A cause that goes on failing is logged again after acceptLogEvery, with
// the failures since its last line; within it, only counted.
func TestAcceptErrorsLogRate(t *testing.T) {
	out := &syncBuffer{}
	a := newAcceptErrors(slog.New(slog.NewTextHandler(out, nil)))
	now := time.Unix(1_000_000, 0)
	a.now = func() time.Time { return now }
	emfile := acceptErr(syscall.EMFILE)
	for range 3 {
		a.note(emfile)
	}
	now = now.Add(acceptLogEvery - time.Second)
	a.note(emfile)
	a.note(acceptErr(syscall.ENFILE))
	if got := out.lines(acceptLogLine); len(got) != 1 || !strings.Contains(got[0], "failures=1 ") {
		t.Fatalf("within %v: got log lines %q, want the first failure's only", acceptLogEvery, got)
	}
	now = now.Add(2 * time.Second)
	a.note(emfile)
	got := out.lines(acceptLogLine)
	if len(got) != 2 || !strings.Contains(got[1], "failures=5 ") || !strings.Contains(got[1], "total=6 ") {
		t.Fatalf("after %v: got log lines %q, want a second one with failures=5 total=6", acceptLogEvery, got)
	}
	if c := a.snapshot(); c[AcceptFDLimit] != 6 || len(c) != 1 {
		t.Errorf("counts: got %v, want fd_limit 6", c)
	}
}
