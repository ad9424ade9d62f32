package meshtest

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// Broker users are the broker's, not a vhost's: two tests that each add a
// node alpha on one broker share the user node.alpha.g1, and one's
// rotation or cleanup takes it from the other. A test whose nodes get
// broker users of their own (mesh node add, join, rotate) therefore runs
// on a leased broker (LeaseRabbitMQ): one of a few shared brokers, its own
// until its Cleanup. Tests without broker users of their own share
// RabbitMQ.

// maxLeasedBrokers bounds the brokers of the lease pool: that many tests
// with broker users run at once, the others wait for a lease.
const maxLeasedBrokers = 3

var leases struct {
	mu      sync.Mutex
	free    *sync.Cond         // signalled when a broker returns or a start fails
	idle    []*Rabbit          // started, leased by no test
	all     []*Rabbit          // every broker of the pool, for stopShared
	held    map[string]*Rabbit // top-level test name -> its broker
	started int                // brokers of the pool started or starting, and not given up
}

func init() {
	leases.free = sync.NewCond(&leases.mu)
	leases.held = map[string]*Rabbit{}
}

// LeaseRabbitMQ returns a broker of the lease pool that is tb's alone
// until tb's Cleanup, for a test whose nodes get broker users of their
// own (see above); it waits while every broker of the pool is leased.
// Another call from the same top-level test, or from one of its subtests,
// returns the same broker while the lease lasts; it ends with the test
// (or subtest) that took it, so a test whose subtests share a broker
// takes it first. When the lease ends, the broker's users other than
// guest are deleted, so the next test finds none of them. The test must
// not stop the broker (fault tests take a private one, NewRabbitMQ).
// Main stops the pool.
func LeaseRabbitMQ(tb testing.TB) *Rabbit {
	tb.Helper()
	top, _, _ := strings.Cut(tb.Name(), "/")
	leases.mu.Lock()
	defer leases.mu.Unlock()
	if r := leases.held[top]; r != nil {
		return r
	}
	var waited time.Duration // for other tests' leases to end
	var r *Rabbit
	for r == nil {
		switch {
		case len(leases.idle) > 0:
			r = leases.idle[len(leases.idle)-1]
			leases.idle = leases.idle[:len(leases.idle)-1]
		case leases.started < maxLeasedBrokers:
			leases.started++
			leases.mu.Unlock()
			start := time.Now()
			nr, err := newRabbit(false)
			leases.mu.Lock()
			if err != nil {
				leases.started--
				leases.free.Signal()
				tb.Fatalf("meshtest: start a broker of the lease pool: %v", err)
			}
			tb.Logf("meshtest: leased RabbitMQ %s ready on %s in %v", nr.node, nr.URL(), time.Since(start).Round(time.Millisecond))
			leases.all = append(leases.all, nr)
			r = nr
		default:
			since := time.Now()
			leases.free.Wait()
			waited += time.Since(since)
		}
	}
	if waited > 0 {
		tb.Logf("meshtest: waited %v for a leased RabbitMQ", waited.Round(time.Millisecond))
	}
	leases.held[top] = r
	tb.Cleanup(func() {
		err := r.clearUsers()
		leases.mu.Lock()
		defer leases.mu.Unlock()
		delete(leases.held, top)
		if err != nil || !r.running() {
			// Not leased again: a test after it would find what is left.
			tb.Errorf("meshtest: return the leased RabbitMQ %s: %v", r.node, err)
			leases.started--
		} else {
			leases.idle = append(leases.idle, r)
		}
		leases.free.Signal()
	})
	return r
}

// clearUsers deletes every broker user but guest.
func (r *Rabbit) clearUsers() error {
	if !r.running() {
		return fmt.Errorf("broker %s not running", r.node)
	}
	var users []struct {
		Name string `json:"name"`
	}
	if err := r.apiInto(http.MethodGet, "/api/users", nil, &users); err != nil {
		return fmt.Errorf("list users: %w", err)
	}
	for _, u := range users {
		if u.Name == "guest" {
			continue
		}
		if err := r.api(http.MethodDelete, "/api/users/"+url.PathEscape(u.Name), nil); err != nil {
			return fmt.Errorf("delete user %s: %w", u.Name, err)
		}
	}
	return nil
}

// stopLeased stops every broker of the lease pool (Main, after the tests).
func stopLeased() error {
	leases.mu.Lock()
	defer leases.mu.Unlock()
	var errs []error
	for _, r := range leases.all {
		if err := r.destroy(); err != nil {
			errs = append(errs, fmt.Errorf("stop leased RabbitMQ %s: %w", r.node, err))
		}
	}
	leases.all, leases.idle, leases.started = nil, nil, 0
	clear(leases.held)
	return errors.Join(errs...)
}
