package link

import (
	"slices"
	"sync"
	"time"

	"github.com/meshbox/meshbox/internal/backoff"
	"github.com/meshbox/meshbox/internal/brokerurl"
	"github.com/meshbox/meshbox/internal/redact"
	"github.com/meshbox/meshbox/internal/wire"
)

// historyLen bounds the link's history and its failovers.
const historyLen = 20

// Link is the state of a node's broker link: the broker URLs, the one in
// use, the link's state, since when and why, its recent history and
// failovers, the credential in use, the link's generations and the extra
// connections. It holds no session: the bridge keeps its session beside
// it. Its methods may be called from any goroutine; mu guards every field
// but the channels, made once, extras, which has its own, and ev, set
// once before use (SetEvents).
type Link struct {
	mu        sync.Mutex
	url       string   // the setting: one URL or several (internal/brokerurl)
	urls      []string // url split
	pos       int      // index in urls of the broker in use or tried next; -1: pick one at random
	connected string   // host:port of the broker the last session ran on ("" before the first)
	state     string
	since     time.Time
	reason    string
	blocked   string // the broker's reason while it blocks the publishing connection
	history   []StateChange
	failovers []Failover

	urlChanged chan struct{}  // cap 1: SetURL wakes the link loop
	fatal      chan error     // cap 1: the node name was refused for good
	retry      backoff.Policy // reconnect backoff
	probe      backoff.Policy // the wait between probes of an unreachable broker (probe.go)
	cred       credential     // the credential in use (credential.go)
	handing    chan struct{}  // non-nil during a handover; closed at its end
	gen        generation     // the sessions so far (generation.go)
	extras     extraConns     // the connections beside the link's two (generation.go)
	ev         Events         // whom it tells of its changes (events.go)
	events     EventBinder    // the event queue's bindings (eventbind.go)
}

// StateChange is one entry of the link's history.
type StateChange struct {
	State  string    `json:"state"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
	// Broker is the broker (host:port) the link was on or trying then.
	Broker string `json:"broker,omitempty"`
}

// Failover is one move of the link from one broker of its list to another.
type Failover struct {
	At     time.Time `json:"at"`
	From   string    `json:"from"`             // host:port of the broker left
	To     string    `json:"to"`               // host:port of the broker connected to
	Reason string    `json:"reason,omitempty"` // why the link left From
}

// Status describes the broker link (the node status's broker part).
type Status struct {
	State string    `json:"state"`
	Since time.Time `json:"since"`
	// URL is the broker URL the link is on, or tried last (password
	// redacted); Broker is its host:port ("" while there is none).
	URL    string `json:"url"`
	Broker string `json:"broker,omitempty"`
	// URLs are all the broker URLs configured, when there are several
	// (passwords redacted).
	URLs   []string `json:"urls,omitempty"`
	Reason string   `json:"reason,omitempty"`
	// Blocked is the broker's reason (connection.blocked) while it blocks
	// this node's publishing connection under a resource alarm; empty
	// otherwise. Consuming and acking go on meanwhile.
	Blocked string        `json:"blocked,omitempty"`
	History []StateChange `json:"history"`
	// Failovers are the link's last moves from one broker to another of
	// its list, oldest first (at most 20).
	Failovers []Failover `json:"failovers"`
	// Credential is the broker user the link connects as and its state.
	Credential *CredentialStatus `json:"credential,omitempty"`
	// Extra are the node's connections beside the link's two, on its
	// broker and credential: the tables of rows'.
	Extra []ExtraConnection `json:"extra_connections,omitempty"`
	// EventBindings are the node's event queue's bindings: the topics
	// local programs listen to and the keys bound for them.
	EventBindings *EventBindingStatus `json:"event_bindings,omitempty"`
}

// EventBinding returns the keeper of the event queue's bindings.
func (l *Link) EventBinding() *EventBinder { return &l.events }

// New returns the link of url (one broker URL or several) in state
// wire.StateNone, reconnecting with the backoff retry.
func New(url string, retry backoff.Policy) *Link {
	every := min(retry.Min, ProbeEvery)
	return &Link{url: url, urls: brokerurl.Split(url), pos: -1, state: wire.StateNone, since: time.Now(), retry: retry,
		probe:      backoff.Policy{Min: every, Max: every},
		urlChanged: make(chan struct{}, 1), fatal: make(chan error, 1)}
}

// SetURL records url and reports whether it changed; a change wakes the
// URLChanged channel. The broker in use, when the new list names it (with
// any credential), stays the one in use.
func (l *Link) SetURL(url string) bool {
	l.mu.Lock()
	if l.url == url {
		l.mu.Unlock()
		return false
	}
	in := ""
	if l.pos >= 0 && l.pos < len(l.urls) {
		in = l.urls[l.pos]
	}
	l.url, l.urls = url, brokerurl.Split(url)
	l.pos = slices.IndexFunc(l.urls, func(u string) bool { return in != "" && SameBroker(u, in) })
	l.mu.Unlock()
	select {
	case l.urlChanged <- struct{}{}:
	default:
	}
	return true
}

// URLChanged receives after SetURL changed the setting (one wake-up for
// any number of changes). The link loop alone reads it.
func (l *Link) URLChanged() <-chan struct{} { return l.urlChanged }

// SetFatal hands err to Fatal's channel, unless one waits there already.
func (l *Link) SetFatal(err error) {
	select {
	case l.fatal <- err:
	default:
	}
}

// Fatal yields the error SetFatal handed over.
func (l *Link) Fatal() <-chan error { return l.fatal }

// Backoff returns the wait before reconnect attempt n (1-based).
func (l *Link) Backoff(n int) time.Duration { return l.retry.Delay(n) }

// Set records state and reason. It reports whether the state changed, and
// the broker's URL (redacted) for the log line.
func (l *Link) Set(state, reason string) (changed bool, url string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if state != wire.StateBlocked {
		l.blocked = ""
	}
	if l.state == state {
		l.reason = reason
		return false, ""
	}
	now := time.Now()
	l.state, l.since, l.reason = state, now, reason
	at := l.inUseLocked()
	l.history = append(l.history, StateChange{State: state, At: now, Reason: reason, Broker: brokerurl.Host(at)})
	if len(l.history) > historyLen {
		l.history = slices.Delete(l.history, 0, len(l.history)-historyLen)
	}
	if at == "" {
		at = l.url
	}
	return true, redact.URL(at)
}

// SetBlocked records the broker's reason for blocking publishers.
func (l *Link) SetBlocked(reason string) {
	l.mu.Lock()
	l.blocked = reason
	l.mu.Unlock()
}

// Current returns the link's state and since when it holds.
func (l *Link) Current() (string, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state, l.since
}

// Status returns the link's state, brokers, history and failovers, its
// credential and the extra connections.
func (l *Link) Status() Status {
	st := l.status()
	c := l.CredentialStatus()
	st.Credential = &c
	st.Extra = l.Extras()
	st.EventBindings = l.events.Status()
	return st
}

func (l *Link) status() Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := Status{State: l.state, Since: l.since, URL: redact.URL(l.inUseLocked()), Reason: l.reason,
		Blocked: l.blocked, History: slices.Clone(l.history), Failovers: slices.Clone(l.failovers)}
	if st.Failovers == nil {
		st.Failovers = []Failover{}
	}
	if len(l.urls) > 1 {
		for _, u := range l.urls {
			st.URLs = append(st.URLs, redact.URL(u))
		}
	}
	if st.State != wire.StateNone {
		st.Broker = brokerurl.Host(l.inUseLocked())
	}
	return st
}

// EverConnected reports whether a connected state was ever recorded
// before the current one.
func (l *Link) EverConnected() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, h := range l.history {
		if h.State == wire.StateConnected {
			return true
		}
	}
	return false
}
