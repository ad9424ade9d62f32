package appliance

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/meshbox/meshbox/testing/wait"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// testServer runs an embedded NATS server on a free loopback port.
func testServer(t *testing.T) *server.Server {
	t.Helper()
	return natstest.Start(t)
}

// testConn connects to srv, in process or over TCP, and flushes on return.
func testConn(t *testing.T, srv *server.Server, inProcess bool) *nats.Conn {
	t.Helper()
	if inProcess {
		return natstest.Connect(t, srv)
	}
	return natstest.ConnectTCP(t, srv)
}

func mustSubscribe(t *testing.T, nc *nats.Conn, subject, queue string) *nats.Subscription {
	t.Helper()
	sub, err := nc.QueueSubscribe(subject, queue, func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return sub
}

// wantCheck runs one check and compares what it reports.
func wantCheck(t *testing.T, w *interestWatcher, wantChanged bool, want []string) {
	t.Helper()
	got, changed, err := w.check()
	if err != nil {
		t.Fatal(err)
	}
	if changed != wantChanged || (changed && !slices.Equal(got, want)) {
		t.Fatalf("check: got %v changed=%v, want %v changed=%v", got, changed, want, wantChanged)
	}
}

func TestInterestWatcherSeesEveryKindOfHostButTheNodesOwn(t *testing.T) {
	srv := testServer(t)
	w := newInterestWatcher(srv)
	wantCheck(t, w, true, []string{}) // the first check always reports

	prog := testConn(t, srv, false)
	mustSubscribe(t, prog, "cap.plain", "")
	mustSubscribe(t, prog, "cap.queued", "workers")
	mustSubscribe(t, prog, "work.thumb", "meshbox")
	mustSubscribe(t, prog, "cap.>", "")        // listens, does not host
	mustSubscribe(t, prog, "cap.*.x", "")      // likewise
	mustSubscribe(t, prog, "evt.x", "")        // not hosting at all
	mustSubscribe(t, prog, "node.a.cap.x", "") // addressed subjects are the bridge's
	svcConn := testConn(t, srv, false)
	svc, err := micro.AddService(svcConn, micro.Config{
		Name:     "echo",
		Version:  "1.0.0",
		Endpoint: &micro.EndpointConfig{Subject: "cap.micro", Handler: micro.HandlerFunc(func(r micro.Request) { _ = r.Respond(r.Data()) })},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	if err := svcConn.Flush(); err != nil {
		t.Fatal(err)
	}
	// The node's own connections (stand-ins), over TCP and in process.
	own := testConn(t, srv, false)
	ownIn := testConn(t, srv, true)
	w.exclude(own)
	w.exclude(ownIn)
	mustSubscribe(t, own, "cap.standin", "")
	mustSubscribe(t, ownIn, "cap.standin2", "q")
	mustSubscribe(t, ownIn, "cap.plain", "") // a stand-in beside a local host changes nothing

	wantCheck(t, w, true, []string{"cap.micro", "cap.plain", "cap.queued", "work.thumb"})
}

func TestInterestWatcherReportsChangesOnly(t *testing.T) {
	srv := testServer(t)
	w := newInterestWatcher(srv)
	own := testConn(t, srv, true)
	w.exclude(own)
	wantCheck(t, w, true, []string{})

	// Nothing changed: no snapshot, and the counters say so without one.
	wantCheck(t, w, false, nil)
	before := w.last

	prog := testConn(t, srv, false)
	echo := mustSubscribe(t, prog, "cap.echo", "")
	wantCheck(t, w, true, []string{"cap.echo"})
	wantCheck(t, w, false, nil)

	// The node's own subscriptions move the counters but change nothing
	// hosted: the snapshot is taken and not reported.
	standin := mustSubscribe(t, own, "cap.elsewhere", "")
	wantCheck(t, w, false, nil)
	if w.last == before {
		t.Fatal("the counters did not move with the subscriptions")
	}

	// One subscription replaced by another between two checks: the count
	// of subscriptions is the same, the counters are not.
	if err := echo.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	mustSubscribe(t, prog, "work.resize", "q")
	wantCheck(t, w, true, []string{"work.resize"})

	if err := standin.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := own.Flush(); err != nil {
		t.Fatal(err)
	}
	wantCheck(t, w, false, nil)

	// A program that leaves takes its subscriptions along.
	prog.Close()
	// The server removes a closed client's subscriptions asynchronously.
	var got []string
	wait.Eventually(t, 5*time.Second, "the program's leaving reported", func() error {
		var changed bool
		var err error
		if got, changed, err = w.check(); err == nil && !changed {
			err = errors.New("no change yet")
		}
		return err
	})
	if len(got) != 0 {
		t.Fatalf("after the program left: got %v, want nothing hosted", got)
	}
}

func TestInterestWatcherWatchDeliversInOrderAndStops(t *testing.T) {
	srv := testServer(t)
	w := newInterestWatcher(srv)
	if _, _, err := w.check(); err != nil {
		t.Fatal(err)
	}
	got := make(chan []string, 10)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() { // exits when quit is closed
		defer close(done)
		w.watch(quit, 5*time.Millisecond, time.Hour, time.Hour, func(li localInterest) { got <- li.hosted }, func(err error) { t.Errorf("check: %v", err) })
	}()
	prog := testConn(t, srv, false)
	mustSubscribe(t, prog, "cap.a", "")
	select {
	case s := <-got:
		if !slices.Equal(s, []string{"cap.a"}) {
			t.Fatalf("got %v, want [cap.a]", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no change delivered")
	}
	mustSubscribe(t, prog, "work.b", "")
	select {
	case s := <-got:
		if !slices.Equal(s, []string{"cap.a", "work.b"}) {
			t.Fatalf("got %v, want [cap.a work.b]", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no change delivered")
	}
	close(quit)
	<-done
	if len(got) != 0 {
		t.Fatalf("got %v after the last change, want nothing", <-got)
	}
}

// The appliance's own connections never count: a node with a static
// route keeps the bridge's stand-in for it out of what it hosts, and a
// program's capability reaches the node's status through the watcher.
func TestApplianceHostsProgramsButNotItsStandIns(t *testing.T) {
	cfg := localConfig("alpha", t.TempDir())
	cfg.HTTP = "off"
	cfg.Bridge.Routes = map[string]string{"remote": "beta"}
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	prog, err := nats.Connect(a.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	// The stand-in exists: a call to cap.remote reaches the bridge (which
	// fails it, no broker), not the server's "no responders".
	if _, err := prog.Request("cap.remote", nil, 5*time.Second); errors.Is(err, nats.ErrNoResponders) {
		t.Fatal("cap.remote has no stand-in")
	}
	mustSubscribe(t, prog, "cap.local", "")
	wait.Eventually(t, 5*time.Second, "the node's local capabilities [local] (never the stand-in)", func() error {
		if got := a.parts().node.Capabilities().Local; !slices.Equal(got, []string{"local"}) {
			return fmt.Errorf("got %v", got)
		}
		return nil
	})
	if got := a.parts().bridge.LocalCapabilities(); !slices.Equal(got, []string{"local"}) {
		t.Fatalf("bridge's local capabilities: got %v, want [local]", got)
	}
}

// rawProgram connects to srv over TCP and sends CONNECT and SUB subject in
// one write: the subscription is in place as soon as the server has read
// the connect, with no round trip between them.
func rawProgram(t *testing.T, srv *server.Server, subject string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Write([]byte("CONNECT {\"verbose\":false,\"name\":\"raw\"}\r\nSUB " + subject + " 1\r\nPING\r\n")); err != nil {
		t.Fatal(err)
	}
	return c
}

// wantDelivered waits up to 5 s for the next snapshot from a watch.
func wantDelivered(t *testing.T, got <-chan []string, want []string) {
	t.Helper()
	select {
	case s := <-got:
		if !slices.Equal(s, want) {
			t.Fatalf("got %v, want %v", s, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no change delivered, want %v", want)
	}
}

// startWatch runs w.watch until the test ends and returns what it
// delivers.
func startWatch(t *testing.T, w *interestWatcher, busy, idle, busyFor time.Duration) <-chan []string {
	t.Helper()
	got := make(chan []string, 10)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() { // exits when quit is closed, in the test's cleanup
		defer close(done)
		w.watch(quit, busy, idle, busyFor, func(li localInterest) { got <- li.hosted }, func(err error) { t.Errorf("check: %v", err) })
	}()
	t.Cleanup(func() {
		close(quit)
		<-done
	})
	return got
}

func TestInterestWatcherHearsConnects(t *testing.T) {
	srv := testServer(t)
	w := newInterestWatcher(srv)
	own := testConn(t, srv, true)
	w.exclude(own)
	if err := w.hearConnects(own); err != nil {
		t.Fatal(err)
	}
	testConn(t, srv, false)
	select {
	case <-w.connects:
	case <-time.After(5 * time.Second):
		t.Fatal("a program connected and the watcher did not hear of it")
	}
}

func TestInterestWatcherKnowsWhoIsConnected(t *testing.T) {
	srv := testServer(t)
	w := newInterestWatcher(srv)
	wantOthers := func(want bool) {
		t.Helper()
		got, err := w.othersConnected()
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("othersConnected: got %v, want %v", got, want)
		}
	}
	wantOthers(false)
	own, ownIn := testConn(t, srv, false), testConn(t, srv, true)
	w.exclude(own)
	w.exclude(ownIn)
	wantOthers(false)
	mustSubscribe(t, own, "cap.standin", "")

	prog := testConn(t, srv, false)
	wantOthers(true)
	mustSubscribe(t, prog, "cap.echo", "")
	wantCheck(t, w, true, []string{"cap.echo"})

	// Once the program no longer counts as connected, its subscriptions
	// are gone from the very next snapshot: the watcher may then sleep.
	prog.Close()
	// The server closes a client asynchronously.
	wait.Eventually(t, 5*time.Second, "the program no longer counted as connected", func() error {
		others, err := w.othersConnected()
		if err == nil && others {
			err = errors.New("still connected")
		}
		return err
	})
	wantCheck(t, w, true, []string{})
}

// A node nobody but itself is connected to does not poll (idle is an
// hour here, and the watch is never busy by itself): a program that
// connects wakes the watcher, and its subscriptions are seen at once.
func TestInterestWatcherWakesForAProgramThatConnectsToAQuietNode(t *testing.T) {
	srv := testServer(t)
	w := newInterestWatcher(srv)
	own := testConn(t, srv, true)
	w.exclude(own)
	if err := w.hearConnects(own); err != nil {
		t.Fatal(err)
	}
	got := startWatch(t, w, 20*time.Millisecond, time.Hour, 0)
	wantDelivered(t, got, []string{}) // the first check; the watcher is quiet after it
	rawProgram(t, srv, "cap.raw")
	wantDelivered(t, got, []string{"cap.raw"})
}

// While a program is connected the watcher polls: a subscription it makes
// long after connecting is seen, and so is its leaving.
func TestInterestWatcherPollsWhileAProgramIsConnected(t *testing.T) {
	srv := testServer(t)
	w := newInterestWatcher(srv)
	own := testConn(t, srv, true)
	w.exclude(own)
	if err := w.hearConnects(own); err != nil {
		t.Fatal(err)
	}
	prog := testConn(t, srv, false)
	got := startWatch(t, w, 5*time.Millisecond, 20*time.Millisecond, 0)
	wantDelivered(t, got, []string{})
	mustSubscribe(t, prog, "work.late", "q")
	wantDelivered(t, got, []string{"work.late"})
	prog.Close()
	wantDelivered(t, got, []string{})
}

// The watcher reports the events programs listen to, as AMQP topic
// patterns (wildcards included, the covered ones left out), and not those
// of the node's own connections (the bridge listens to evt.> to send
// events to the mesh); a change of them alone is a change.
func TestInterestWatcherSeesTheEventsListenedTo(t *testing.T) {
	srv := testServer(t)
	w := newInterestWatcher(srv)
	own := testConn(t, srv, true)
	w.exclude(own)
	mustSubscribe(t, own, "evt.>", "")
	wantCheck(t, w, true, []string{})
	if got := w.eventPatterns(); len(got) != 0 {
		t.Fatalf("events of the node's own connection: %q, want none", got)
	}
	prog := testConn(t, srv, false)
	mustSubscribe(t, prog, "evt.door.opened", "")
	mustSubscribe(t, prog, "evt.room.*", "")
	mustSubscribe(t, prog, "evt.room.kitchen", "") // covered by room.*
	wantCheck(t, w, true, []string{})
	if got, want := w.eventPatterns(), []string{"door.opened", "room.*"}; !slices.Equal(got, want) {
		t.Fatalf("events listened to: %q, want %q", got, want)
	}
	mustSubscribe(t, prog, ">", "") // every event too
	wantCheck(t, w, true, []string{})
	if got, want := w.eventPatterns(), []string{"#"}; !slices.Equal(got, want) {
		t.Fatalf("events listened to: %q, want %q", got, want)
	}
}
