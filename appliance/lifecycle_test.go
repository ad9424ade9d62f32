package appliance

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"
)

// stallingBroker accepts TCP connections and never answers: a broker whose
// handshake hangs. accepted yields each connection; closing them releases
// the node's dial.
func stallingBroker(t *testing.T) (url string, accepted <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan net.Conn, 16)
	done := make(chan struct{})
	go func() { // exits when the listener is closed in cleanup
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ch <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		close(ch)
		for c := range ch {
			c.Close()
		}
	})
	return "amqp://guest:guest@" + ln.Addr().String() + "/", ch
}

// get fetches path from the node's HTTP listener and decodes the JSON body
// into v.
func get(t *testing.T, client *http.Client, base, path string, v any) int {
	t.Helper()
	resp, err := client.Get(base + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v in %q", path, err, body)
	}
	return resp.StatusCode
}

// Status reads never wait on Start: while the broker's handshake hangs
// inside Start, /status and /readyz answer, and readiness says why the
// node is not ready yet.
func TestStatusAnswersWhileStartIsBlocked(t *testing.T) {
	broker, accepted := stallingBroker(t)
	cfg := localConfig("alpha", t.TempDir())
	cfg.Broker = Secret(broker)
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	startDone := make(chan error, 1)
	go func() { startDone <- a.Start(context.Background()) }() // ends when Start returns

	var conn net.Conn
	select {
	case conn = <-accepted: // Start is now blocked in the broker's handshake
	case err := <-startDone:
		t.Fatalf("Start returned %v before it dialled the broker", err)
	}
	client := &http.Client{Timeout: 2 * time.Second}
	base := a.HTTPURL()
	if base == "" {
		t.Fatal("no HTTP listener while Start is blocked, want one")
	}
	var st Status
	if code := get(t, client, base, "/status", &st); code != http.StatusOK || st.Node != "alpha" {
		t.Errorf("/status: got %d node %q, want 200 alpha", code, st.Node)
	}
	var rd Readiness
	if code := get(t, client, base, "/readyz", &rd); code != http.StatusServiceUnavailable || !slices.Contains(rd.Reasons, "node is starting") {
		t.Errorf("/readyz: got %d %+v, want 503 with \"node is starting\"", code, rd)
	}
	select {
	case err := <-startDone:
		t.Fatalf("Start returned (%v) before the status answered: want the answers while it is blocked", err)
	default:
	}

	conn.Close() // the handshake fails; the node starts offline
	if err := <-startDone; err != nil {
		t.Fatalf("start: %v", err)
	}
	if code := get(t, client, base, "/readyz", &rd); code != http.StatusOK {
		t.Errorf("/readyz after start: got %d %+v, want 200", code, rd)
	}
}

// Close says "node is stopping" on /readyz while it stops the node, and
// its own HTTP handlers answer meanwhile instead of waiting for Close.
func TestStoppingIsVisibleDuringClose(t *testing.T) {
	cfg := localConfig("alpha", t.TempDir())
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 2 * time.Second}
	var rd Readiness
	var rdCode, stCode int
	var st Status
	a.hook = func(point string) {
		if point != hookStopping {
			return
		}
		base := a.HTTPURL()
		rdCode = get(t, client, base, "/readyz", &rd)
		stCode = get(t, client, base, "/status", &st)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if rdCode != http.StatusServiceUnavailable || !slices.Contains(rd.Reasons, "node is stopping") {
		t.Errorf("/readyz during Close: got %d %+v, want 503 with \"node is stopping\"", rdCode, rd)
	}
	if stCode != http.StatusOK || st.Node != "alpha" {
		t.Errorf("/status during Close: got %d node %q, want 200 alpha", stCode, st.Node)
	}
}

// Close does not wait for a Start that waits on the network: it cancels it.
func TestCloseCancelsBlockedStart(t *testing.T) {
	broker, accepted := stallingBroker(t)
	cfg := localConfig("alpha", t.TempDir())
	cfg.Broker = Secret(broker)
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	startDone := make(chan error, 1)
	go func() { startDone <- a.Start(context.Background()) }() // ends when Start returns
	select {
	case <-accepted: // Start is blocked in the broker's handshake
	case err := <-startDone:
		t.Fatalf("Start returned %v before it dialled the broker", err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if err := <-startDone; err == nil {
		t.Error("Start cut short by Close: got no error, want one")
	}
	if rd := a.Readiness(); rd.Ready || !slices.Contains(rd.Reasons, "node is stopping") {
		t.Errorf("readiness after Close: got %+v, want not ready, stopping", rd)
	}
}
