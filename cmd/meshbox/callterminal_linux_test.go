package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go"
)

// openPTY opens a pseudo-terminal: its controlling side and the terminal
// a program writes to.
func openPTY(t *testing.T) (control, term *os.File) {
	t.Helper()
	control, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open a pseudo-terminal: %v (Linux has them: /dev/ptmx)", err)
	}
	t.Cleanup(func() { control.Close() })
	ioctl := func(req uintptr, arg unsafe.Pointer) error {
		if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, control.Fd(), req, uintptr(arg)); e != 0 {
			return e
		}
		return nil
	}
	var unlock int32
	if err := ioctl(syscall.TIOCSPTLCK, unsafe.Pointer(&unlock)); err != nil {
		t.Fatalf("unlock the pseudo-terminal: %v", err)
	}
	var n uint32
	if err := ioctl(syscall.TIOCGPTN, unsafe.Pointer(&n)); err != nil {
		t.Fatalf("pseudo-terminal number: %v", err)
	}
	term, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { term.Close() })
	return control, term
}

// TestCallEndsItsLineOnATerminal: meshbox call on a terminal ends a reply
// that lacks a line break with one, so that the prompt does not follow
// it on its line.
func TestCallEndsItsLineOnATerminal(t *testing.T) {
	url, prog, _ := standaloneNode(t)
	if _, err := prog.Subscribe("cap.echo", func(m *nats.Msg) { _ = m.Respond(append([]byte("echo:"), m.Data...)) }); err != nil {
		t.Fatal(err)
	}
	if err := prog.Flush(); err != nil {
		t.Fatal(err)
	}
	control, term := openPTY(t)
	if !isTerminal(term) {
		t.Fatal("a pseudo-terminal is not taken for a terminal")
	}
	m := &Main{Stdin: strings.NewReader(""), Stdout: term, Stderr: &bytes.Buffer{},
		Getenv: func(k string) string { return map[string]string{"MESHBOX_SERVER": url}[k] }}
	if err := m.Run(t.Context(), []string{"call", "echo", "hi"}); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() { // ends when the terminal's output is read or the controller closes in cleanup
		buf := make([]byte, 64)
		n, _ := io.ReadAtLeast(control, buf, len("echo:hi\r\n"))
		got <- string(buf[:n])
	}()
	select {
	case out := <-got:
		// The terminal writes a line break as \r\n.
		if out != "echo:hi\r\n" {
			t.Errorf("the terminal shows %q, want %q", out, "echo:hi\r\n")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing on the terminal after 10s")
	}
}
