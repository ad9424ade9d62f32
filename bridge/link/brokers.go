package link

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/meshbox/meshbox/internal/brokerurl"
	"github.com/meshbox/meshbox/internal/redact"
	"github.com/meshbox/meshbox/internal/wire"
	amqp "github.com/rabbitmq/amqp091-go"
)

// This file is the link's list of brokers (Config.URL may name several,
// the nodes of a cluster): which one to connect to, the move to the next
// on a failure, and the record of failovers. The fields are the link's,
// guarded by Link.mu.

// Target returns the broker URL to connect to now: the one in use or
// tried last, or one picked at random when there is none yet. "" when no
// broker is configured.
func (l *Link) Target() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.urls) == 0 {
		return ""
	}
	if l.pos < 0 || l.pos >= len(l.urls) {
		l.pos = rand.IntN(len(l.urls))
	}
	return l.urls[l.pos]
}

// Advance moves to the next broker of the list: the link failed on the
// current one. It returns the URL to try next.
func (l *Link) Advance() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.urls) == 0 {
		return ""
	}
	if l.pos < 0 {
		l.pos = rand.IntN(len(l.urls))
	} else {
		l.pos = (l.pos + 1) % len(l.urls)
	}
	return l.urls[l.pos]
}

// Brokers returns how many broker URLs the setting names (at least 1).
func (l *Link) Brokers() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(1, len(l.urls))
}

// Holds reports whether u is one of the broker URLs of the setting.
func (l *Link) Holds(u string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.urls, u)
}

// SameBrokerAs returns the URL of the setting that names the same broker
// and vhost as u (it may differ in credential), "" if none.
func (l *Link) SameBrokerAs(u string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.urls {
		if SameBroker(c, u) {
			return c
		}
	}
	return ""
}

// ConnectedTo records that a session runs on the broker of url. When that
// is another broker than the last session's, it is a failover, recorded
// with why the link left the last one (reason) and returned (to log).
func (l *Link) ConnectedTo(url, reason string) (fo Failover, moved bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	host := brokerurl.Host(url)
	if i := slices.Index(l.urls, url); i >= 0 {
		l.pos = i
	}
	prev := l.connected
	l.connected = host
	if prev == "" || prev == host {
		return Failover{}, false
	}
	fo = Failover{At: time.Now(), From: prev, To: host, Reason: reason}
	l.failovers = append(l.failovers, fo)
	if len(l.failovers) > historyLen {
		l.failovers = slices.Delete(l.failovers, 0, len(l.failovers)-historyLen)
	}
	return fo, true
}

// inUseLocked returns the broker URL in use or tried last ("" before the first
// attempt), with l.mu held.
func (l *Link) inUseLocked() string {
	if l.pos >= 0 && l.pos < len(l.urls) {
		return l.urls[l.pos]
	}
	if len(l.urls) == 1 {
		return l.urls[0]
	}
	return ""
}

// CurrentURL returns the broker setting: one URL or several.
func (l *Link) CurrentURL() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.url
}

// CheckURL accepts "" (no broker) and one or several amqp:// or
// amqps:// URLs separated by commas, all with the same user, which, when
// it is a node's broker user, is node's own: every message carries it as
// its origin.
func CheckURL(raw, node string) error {
	urls := brokerurl.Split(raw)
	if len(urls) == 0 {
		return nil
	}
	var user string
	for i, u := range urls {
		if u == "" {
			return fmt.Errorf("%s: broker URL %d of %d is empty", redact.URL(raw), i+1, len(urls))
		}
		uri, err := amqp.ParseURI(u)
		if err != nil {
			return fmt.Errorf("%s: %v", redact.URL(u), err)
		}
		if owner, _, ok := wire.ParseBrokerUser(uri.Username); ok && owner != node {
			return fmt.Errorf("%s: broker user %s is node %s's, not node %s's", redact.URL(u), uri.Username, owner, node)
		}
		if i > 0 && uri.Username != user {
			return fmt.Errorf("%s: user %q differs from the first broker URL's %q: every broker of a list is reached with the same credential",
				redact.URL(u), uri.Username, user)
		}
		user = uri.Username
	}
	return nil
}
