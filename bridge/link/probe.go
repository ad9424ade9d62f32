package link

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/meshbox/meshbox/internal/brokerurl"
)

// This file is how the link finds an unreachable broker answering again.
// A connection attempt that fails before its TCP connection is up (refused,
// no route, dial timeout) does not wait out the growing backoff: the link
// probes the broker with a bare TCP dial every ProbeEvery at most
// (jittered, one probe at a time), moving on through the list of brokers
// after each failed probe, and makes the next connection attempt as soon as
// a probe connects. A probe costs one TCP handshake (nothing at all on a
// host that answers with a reset, one SYN on a link that carries nothing),
// and no TLS, login or topology. An attempt that reached the broker and
// failed there (the broker is starting, refuses the credential or the
// node's name) waits the growing backoff instead: the broker answers TCP,
// so probing it would only spin.

const (
	// ProbeEvery is the most the link waits between two probes; the wait is
	// jittered over its upper half (internal/backoff), and never longer
	// than the reconnect backoff's minimum.
	ProbeEvery = 200 * time.Millisecond
	// probeDialTimeout bounds a probe's TCP connect: long enough for a SYN
	// retransmitted once over a slow link, short enough that a link that
	// carries nothing is dialled afresh about every two seconds.
	probeDialTimeout = 2 * time.Second
)

// UnreachableError is a connection attempt that failed before its TCP
// connection to the broker at Addr (host:port) was up.
type UnreachableError struct {
	Addr string
	Err  error
}

func (e *UnreachableError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *UnreachableError) Unwrap() error { return e.Err }

// Unreachable reports whether err, the failure of a TCP dial, means the
// broker does not answer now: probing finds it when it does. A name that
// does not resolve (NXDOMAIN) is not: it is a setting to fix, not a broker
// to wait for, and is retried with the backoff.
func Unreachable(err error) bool {
	var de *net.DNSError
	return !errors.As(err, &de) || !de.IsNotFound
}

// Awaited is how AwaitBroker ended.
type Awaited int

// How AwaitBroker ended.
const (
	AwaitAnswered   Awaited = iota // a probe connected: attempt now
	AwaitCameBack                  // the same, on a broker found unreachable: the backoff starts over
	AwaitURLChanged                // a new broker setting: attempt now
	AwaitQuit                      // quit was closed
)

// AwaitBroker probes the link's target broker until one answers, after a
// connection attempt found it unreachable. down holds the brokers
// (host:port) found unreachable since the last session; AwaitBroker adds
// those its probes find so and removes the one that answers. A probe that
// fails in another way than unreachable ends the wait too: the connection
// attempt that follows fails the same way and takes the backoff. dialed
// is told of each probe's outcome, offline of each broker found
// unreachable. The link loop alone calls it; it returns AwaitQuit once
// quit is closed.
func (l *Link) AwaitBroker(quit <-chan struct{}, down map[string]bool, dialed func(error), offline func(reason string)) Awaited {
	ctx, cancel := WithQuit(context.Background(), quit)
	defer cancel()
	for {
		t := time.NewTimer(l.probe.Delay(1))
		select {
		case <-quit:
			t.Stop()
			return AwaitQuit
		case <-l.urlChanged:
			t.Stop()
			return AwaitURLChanged
		case <-t.C:
		}
		url := l.Target()
		if url == "" {
			return AwaitURLChanged
		}
		addr := brokerurl.Host(url)
		err := Probe(ctx, addr)
		dialed(err)
		if ctx.Err() != nil {
			return AwaitQuit
		}
		if err == nil || !Unreachable(err) {
			back := down[addr]
			delete(down, addr)
			if back && err == nil {
				return AwaitCameBack
			}
			return AwaitAnswered
		}
		down[addr] = true
		offline(fmt.Sprintf("connect to broker: %v", err))
		l.Advance()
	}
}

// Probe dials addr over TCP and closes the connection at once.
func Probe(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: probeDialTimeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	_ = c.Close()
	return nil
}
