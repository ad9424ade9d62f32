package rows

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/internal/backoff"
)

// The sync: one AMQP connection to the broker, dialled through the
// node's broker link (Link), a confirmed publisher of the node's pending
// writes, and a consumer per table of its log (a stream queue), from the
// offset the store saved.

const (
	// linkRole names the sync's connection on the broker link.
	linkRole     = "rows"
	meshExchange = "mesh"
	// publishBatch is the most changes one log message carries;
	// publishWindow the log messages unconfirmed at once.
	publishBatch  = 128
	publishWindow = 64
	// applyBatch is the most log messages applied in one commit;
	// applyLinger how long a run waits for more after its first. The
	// library hands deliveries over one at a time on an unbuffered
	// channel: a receive that does not wait finds the next only if its
	// goroutine is already blocked on the send, and a reader behind the
	// log would commit one message at a time (a few hundred a second,
	// slower than the nodes write).
	applyBatch  = 512
	applyLinger = 2 * time.Millisecond
	// readPrefetch is the log messages a table's consumer holds unacked:
	// with a run's bound (applyBytes), what bounds a reader's memory (at
	// most 256 snapshot parts of 256 KiB, or change batches of 128 writes).
	readPrefetch = 256
)

func (e *Engine) run() {
	defer close(e.done)
	retry := backoff.Policy{Min: time.Second, Max: 30 * time.Second}
	failures := 0
	lastErr := ""
	for {
		tables := e.Tables()
		if e.cfg.Link == nil || e.cfg.Keys == nil || len(tables) == 0 {
			select {
			case <-e.quit:
				return
			case <-e.reconf:
			case <-time.After(5 * time.Second):
			}
			continue
		}
		began := time.Now()
		err := e.session(tables)
		if time.Since(began) > 30*time.Second {
			failures = 0 // it worked a while: the next try is soon
		}
		select {
		case <-e.quit:
			return
		default:
		}
		e.mu.Lock()
		e.linkErr = ""
		if err != nil {
			e.linkErr = err.Error()
		}
		e.mu.Unlock()
		if err == nil {
			failures, lastErr = 0, ""
			continue
		}
		failures++
		// A link that is down is the bridge's to report; the sync waits
		// for it to connect.
		if !errors.Is(err, ErrLinkDown) {
			e.m.errors.WithLabelValues("broker").Inc()
			if err.Error() != lastErr {
				lastErr = err.Error()
				e.log.Warn("rows: the link to the tables' logs failed; local reads and writes go on, writes wait for the broker", "err", err)
			}
		}
		select {
		case <-e.quit:
			return
		case <-e.reconf:
		case <-e.linkUp:
			// The node's link connected (again): the next tries are soon
			// (the broker's queues may still be starting).
			failures = 0
		case <-time.After(retry.Delay(failures)):
		}
	}
}

// session runs one connection, dialled through the node's broker link,
// until it fails (an error), the tables change or the link moves to
// another broker or credential (nil), or the engine closes.
func (e *Engine) session(tables map[string]TableSpec) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // exits when the session ends or the engine closes
		select {
		case <-e.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	moved := e.cfg.Link.Moved() // before the dial: a move during it ends the session at once
	conn, user, err := e.cfg.Link.Dial(ctx, linkRole)
	if err != nil {
		return &dialError{err}
	}
	defer func() { _ = conn.CloseDeadline(time.Now().Add(2 * time.Second)) }()
	e.setLogin(user) // before any message is read: whose word is an origin (trust.go)
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	if e.cfg.Declare != nil && e.cfg.Declare(user) {
		if err := e.declare(conn, slices.Collect(maps.Keys(tables))); err != nil {
			return err
		}
	}
	errs := make(chan error, len(tables)+1)
	var wg sync.WaitGroup
	for t := range tables {
		wg.Add(1)
		go func() { // exits when ctx ends or its channel closes
			defer wg.Done()
			errs <- e.readLog(ctx, conn, t)
		}()
	}
	wg.Add(1)
	go func() { // exits when ctx ends or its channel closes
		defer wg.Done()
		errs <- e.publish(ctx, conn, user, tables)
	}()
	// On the way out: stop the parts, close the connection (which ends
	// their channels: a channel's own close can wait forever on a stream
	// consumer's deliveries), then wait for them.
	defer wg.Wait()
	defer func() { _ = conn.CloseDeadline(time.Now().Add(2 * time.Second)) }()
	defer cancel()
	e.log.Info("rows: reading the tables' logs", "tables", len(tables))
	select {
	case <-e.quit:
		return nil
	case <-e.reconf:
		return nil
	case <-moved:
		e.log.Info("rows: the node's broker link moved; reading the tables' logs through it again")
		return nil
	case err := <-closed:
		if err == nil {
			return errors.New("connection closed")
		}
		return err
	case err := <-errs:
		if err == nil {
			err = errors.New("a table's reader ended")
		}
		return err
	}
}

// declare makes the tables' stream queues and bindings (a mesh on one
// credential, whose nodes may).
func (e *Engine) declare(conn *amqp.Connection, tables []string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	if err := ch.ExchangeDeclare(meshExchange, "topic", true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", meshExchange, err)
	}
	for _, t := range tables {
		if _, err := ch.QueueDeclare(QueueOf(t), true, false, false, false, StreamArgs(e.cfg.MaxAge, e.cfg.MaxBytes)); err != nil {
			return fmt.Errorf("declare the log of table %s: %w", t, err)
		}
		if err := ch.QueueBind(QueueOf(t), QueueOf(t), meshExchange, false, nil); err != nil {
			return fmt.Errorf("bind the log of table %s: %w", t, err)
		}
	}
	return nil
}

// StreamArgs are the arguments of a table's stream queue: retention by
// age and size, in segments small enough for retention to bite. A bound
// of 0 or less is the default's (a stream of 0 bytes takes no message
// and confirms none).
func StreamArgs(maxAge time.Duration, maxBytes int64) amqp.Table {
	if maxAge <= 0 {
		maxAge = DefaultMaxAge
	}
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	return amqp.Table{
		"x-queue-type":                    "stream",
		"x-max-age":                       strconv.FormatInt(int64(maxAge/time.Second), 10) + "s",
		"x-max-length-bytes":              maxBytes,
		"x-stream-max-segment-size-bytes": int64(min(maxBytes/4, 16<<20)),
	}
}

// drain takes deliveries until the library closes the channel.
func drain(ds <-chan amqp.Delivery) {
	for range ds {
	}
}

// dialError is a session that did not connect.
type dialError struct{ err error }

func (e *dialError) Error() string { return "connect: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }
