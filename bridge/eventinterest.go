package bridge

import (
	"errors"
	"os"
	"path/filepath"
	"time"

	brokerlink "github.com/meshbox/meshbox/bridge/link"
)

// SetEventInterest replaces the topic patterns (AMQP syntax) local
// programs listen to: the event queue is bound to those events of the
// other nodes at once, or at the next session's setup (link.EventBinder).
func (b *Bridge) SetEventInterest(patterns []string) { b.link.EventBinding().SetInterest(patterns) }

// SetEventPeers replaces the other nodes known, whose event lanes it binds,
// and legacy: one may publish without lanes (the shared keys are bound too).
func (b *Bridge) SetEventPeers(peers []string, legacy bool) {
	b.link.EventBinding().SetPeers(peers, legacy)
}

// SetEventListeners replaces what the other nodes listen to (discovery's
// view, from what it heard since since): no event goes that none wants.
func (b *Bridge) SetEventListeners(all bool, why string, patterns []string, wants func(string) bool, since time.Time) {
	b.link.EventBinding().SetListeners(all, why, patterns, wants, since)
}

// openEventBindings readies the event queue's bindings and their record
// beside the outbox, before the outbox is opened: an outbox without the
// record is an older meshbox's, which bound every event.
func (b *Bridge) openEventBindings() {
	var path string
	upgraded := false
	if b.cfg.OutboxPath != "" {
		path = filepath.Join(filepath.Dir(b.cfg.OutboxPath), brokerlink.EventRecordFile)
		_, oerr := os.Stat(b.cfg.OutboxPath)
		_, rerr := os.Stat(path)
		upgraded = oerr == nil && errors.Is(rerr, os.ErrNotExist)
	}
	b.link.EventBinding().Open(b.cfg.Node, path, upgraded, b.log, b.m.Metrics)
}
