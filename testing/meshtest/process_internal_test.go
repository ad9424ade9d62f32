package meshtest

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseReady(t *testing.T) {
	tests := []struct {
		name   string
		line   string
		want   readyInfo
		wantOK bool
	}{
		{
			name:   "text",
			line:   `time=2026-01-02T03:04:05.000Z level=INFO msg="node ready" node=n1 nats=nats://127.0.0.1:4222 http=http://127.0.0.1:7222`,
			want:   readyInfo{node: "n1", nats: "nats://127.0.0.1:4222", http: "http://127.0.0.1:7222"},
			wantOK: true,
		},
		{
			name:   "text with component, quoted values and no node",
			line:   `time=x level=INFO component=appliance msg="node ready" nats=nats://127.0.0.1:1 http="" data="/tmp/with space" version=dev`,
			want:   readyInfo{nats: "nats://127.0.0.1:1"},
			wantOK: true,
		},
		{
			name:   "json",
			line:   `{"time":"x","level":"INFO","msg":"node ready","node":"n2","nats":"nats://127.0.0.1:2","http":"http://127.0.0.1:3"}`,
			want:   readyInfo{node: "n2", nats: "nats://127.0.0.1:2", http: "http://127.0.0.1:3"},
			wantOK: true,
		},
		{name: "other message", line: `time=x level=INFO msg="node ready soon" nats=a`},
		{name: "ready text in another attribute", line: `time=x level=INFO msg=starting note="node ready"`},
		{name: "json other message", line: `{"msg":"starting","nats":"x"}`},
		{name: "broken json", line: `{"msg":"node ready"`},
		{name: "empty", line: ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseReady(tt.line)
			if ok != tt.wantOK || got != tt.want {
				t.Fatalf("got %+v, %v; want %+v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestHasFlag(t *testing.T) {
	tests := []struct {
		args []string
		name string
		want bool
	}{
		{[]string{"--data", "/x"}, "data", true},
		{[]string{"-data=/x"}, "data", true},
		{[]string{"--data=/x"}, "data", true},
		{[]string{"--database", "x"}, "data", false},
		{[]string{"--node", "data"}, "data", false},
		{[]string{"--", "--data"}, "data", false},
		{nil, "nats", false},
	}
	for _, tt := range tests {
		if got := hasFlag(tt.args, tt.name); got != tt.want {
			t.Errorf("hasFlag(%q, %q): got %v, want %v", tt.args, tt.name, got, tt.want)
		}
	}
}

// fakeEnv is the environment that makes this test binary a fake node; the
// race detector's one-second pause at exit is turned off.
func fakeEnv(mode string) []string {
	return []string{"MESHTEST_FAKE_NODE=" + mode, "GORACE=atexit_sleep_ms=0"}
}

// The fake node is this test binary itself; see fakeNode in the external
// tests, which TestMain runs when MESHTEST_FAKE_NODE is set.

func TestStartProcessText(t *testing.T) {
	p := startProcess(t, os.Args[0], fakeEnv("text"), withDefaults(t, []string{"--node", "fake"}))
	if got, want := p.NATSURL(), "nats://127.0.0.1:4222"; got != want {
		t.Errorf("NATSURL: got %q, want %q", got, want)
	}
	if got, want := p.HTTPURL(), "http://127.0.0.1:7222"; got != want {
		t.Errorf("HTTPURL: got %q, want %q", got, want)
	}
	if got, want := p.Node(), "fake"; got != want {
		t.Errorf("Node: got %q, want %q", got, want)
	}
	for _, want := range []string{"args: run --node fake --data ", " --nats 127.0.0.1:0 --http 127.0.0.1:0"} {
		if !strings.Contains(p.Output(), want) {
			t.Errorf("output %q: want it to contain %q", p.Output(), want)
		}
	}
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(); code != 0 {
		t.Fatalf("exit code after SIGTERM: got %d, want 0", code)
	}
	if !strings.Contains(p.Output(), "msg=stopped") {
		t.Fatalf("output %q: want the stop line", p.Output())
	}
}

func TestStartProcessJSONKeepsGivenFlags(t *testing.T) {
	p := startProcess(t, os.Args[0], fakeEnv("json"),
		withDefaults(t, []string{"--data=/nowhere", "-nats", "127.0.0.1:9", "--http", "off"}))
	if got, want := p.NATSURL(), "nats://127.0.0.1:4223"; got != want {
		t.Errorf("NATSURL: got %q, want %q", got, want)
	}
	if got, want := p.HTTPURL(), "http://127.0.0.1:7223"; got != want {
		t.Errorf("HTTPURL: got %q, want %q", got, want)
	}
	if want := "args: run --data=/nowhere -nats 127.0.0.1:9 --http off\n"; !strings.Contains(p.Output(), want) {
		t.Errorf("output %q: want it to contain %q", p.Output(), want)
	}
	p.Kill()
	if code := p.Wait(); code != -1 {
		t.Fatalf("exit code after SIGKILL: got %d, want -1", code)
	}
}

func TestExpectFailure(t *testing.T) {
	code, out := expectFailure(t, os.Args[0], fakeEnv("refuse"), withDefaults(t, nil))
	if code != 3 {
		t.Errorf("exit code: got %d, want 3", code)
	}
	if !strings.Contains(out, "in use by another meshbox process") {
		t.Errorf("output %q: want the refusal", out)
	}
}

func TestStartProcessNotReady(t *testing.T) {
	old := processReadyTimeout
	processReadyTimeout = 500 * time.Millisecond
	defer func() { processReadyTimeout = old }()

	// A sub-test that must fail: run it on a recorder.
	rec := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer rec.runCleanups()
		startProcess(rec, os.Args[0], fakeEnv("silent"), withDefaults(rec, nil))
	}()
	<-done
	if !rec.fatal || !strings.Contains(rec.msg, "not ready after") {
		t.Fatalf("got fatal=%v msg=%q, want a not-ready failure", rec.fatal, rec.msg)
	}
}

// recorder is a testing.TB that records Fatalf instead of failing the test,
// for checking the harness's own failure paths.
type recorder struct {
	testing.TB
	fatal    bool
	msg      string
	cleanups []func()
}

func (r *recorder) Helper()             {}
func (r *recorder) Failed() bool        { return r.fatal }
func (r *recorder) Logf(string, ...any) {}
func (r *recorder) Cleanup(f func())    { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = true
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) runCleanups() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}
