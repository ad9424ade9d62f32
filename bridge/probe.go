package bridge

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
// probes the broker with a bare TCP dial every probeEvery at most
// (jittered, one probe at a time), moving on through the list of brokers
// after each failed probe, and makes the next connection attempt as soon as
// a probe connects. A probe costs one TCP handshake (nothing at all on a
// host that answers with a reset, one SYN on a link that carries nothing),
// and no TLS, login or topology. An attempt that reached the broker and
// failed there (the broker is starting, refuses the credential or the
// node's name) waits the growing backoff instead: the broker answers TCP,
// so probing it would only spin.

const (
	// probeEvery is the most the link waits between two probes; the wait is
	// jittered over its upper half (internal/backoff), and never longer
	// than Config.ReconnectMin.
	probeEvery = 200 * time.Millisecond
	// probeDialTimeout bounds a probe's TCP connect: long enough for a SYN
	// retransmitted once over a slow link, short enough that a link that
	// carries nothing is dialled afresh about every two seconds.
	probeDialTimeout = 2 * time.Second
)

// Results in meshbox_broker_dials_total{result}.
const (
	dialConnected = "connected"
	dialFailed    = "failed"
)

// unreachableError is a connection attempt that failed before its TCP
// connection to the broker at addr (host:port) was up.
type unreachableError struct {
	addr string
	err  error
}

func (e *unreachableError) Error() string { return e.err.Error() }

func (e *unreachableError) Unwrap() error { return e.err }

// unreachable reports whether err, the failure of a TCP dial, means the
// broker does not answer now: probing finds it when it does. A name that
// does not resolve (NXDOMAIN) is not: it is a setting to fix, not a broker
// to wait for, and is retried with the backoff.
func unreachable(err error) bool {
	var de *net.DNSError
	return !errors.As(err, &de) || !de.IsNotFound
}

// awaited is how awaitBroker ended.
type awaited int

const (
	awaitAnswered   awaited = iota // a probe connected: attempt now
	awaitCameBack                  // the same, on a broker found unreachable: the backoff starts over
	awaitURLChanged                // a new broker setting: attempt now
	awaitQuit                      // the bridge closes
)

// awaitBroker probes the link's target broker until one answers, after a
// connection attempt found it unreachable. down holds the brokers
// (host:port) found unreachable since the last session; awaitBroker adds
// those its probes find so and removes the one that answers. A probe that
// fails in another way than unreachable ends the wait too: the connection
// attempt that follows fails the same way and takes the backoff. Link loop
// only.
func (b *Bridge) awaitBroker(down map[string]bool) awaited {
	ctx, cancel := b.withQuit(context.Background())
	defer cancel()
	for {
		t := time.NewTimer(b.link.probe.Delay(1))
		select {
		case <-b.quit:
			t.Stop()
			return awaitQuit
		case <-b.link.urlChanged:
			t.Stop()
			return awaitURLChanged
		case <-t.C:
		}
		url := b.link.target()
		if url == "" {
			return awaitURLChanged
		}
		addr := brokerurl.Host(url)
		err := b.probe(ctx, addr)
		if ctx.Err() != nil {
			return awaitQuit
		}
		if err == nil || !unreachable(err) {
			back := down[addr]
			delete(down, addr)
			if back && err == nil {
				return awaitCameBack
			}
			return awaitAnswered
		}
		down[addr] = true
		b.setState(StateOffline, fmt.Sprintf("connect to broker: %v", err))
		b.link.advance()
	}
}

// probe dials addr over TCP and closes the connection at once.
func (b *Bridge) probe(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: probeDialTimeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	b.m.dialed(err)
	if err != nil {
		return err
	}
	_ = c.Close()
	return nil
}
