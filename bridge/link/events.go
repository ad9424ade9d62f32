package link

import (
	"log/slog"
	"time"

	"github.com/meshbox/meshbox/internal/wire"
)

// Events are whom a Link tells of its changes: the log, the metrics and
// the bridge's callbacks. SetEvents sets them before the link is used.
type Events struct {
	Log     *slog.Logger
	Metrics *Metrics
	Perms   *Perms // Accepted: the broker users a session ran with
	// Connected is called when the link is connected, NotConnected when
	// it goes to any other state (nil: none).
	Connected, NotConnected func()
	// OnCredential is told the user a session runs with when it is another
	// than the last one in use (nil: none).
	OnCredential func(user string)
	// URLOverride names where a broker URL that overrides the bindings
	// comes from ("": none), for the log line of a refused credential.
	URLOverride string
}

// SetEvents sets whom the link tells of its changes.
func (l *Link) SetEvents(ev Events) { l.ev = ev }

// SetState records a link state change and logs it once.
func (l *Link) SetState(state, reason string) {
	changed, url := l.Set(state, reason)
	if !changed {
		return
	}
	l.ev.Metrics.SetState(state)
	switch {
	case state == wire.StateConnected, state == wire.StateConnecting, state == wire.StateNone, reason == ReasonShutdown:
		l.ev.Log.Info("broker link "+state, "url", url, "reason", reason)
	default:
		l.ev.Log.Warn("broker link "+state, "url", url, "reason", reason)
	}
	if state == wire.StateConnected {
		l.events.Connected(time.Now()) // before discovery hears of it (EventBinder.KeepLocal)
		if l.ev.Connected != nil {
			l.ev.Connected()
		}
	}
	if state != wire.StateConnected {
		l.events.Disconnected() // no view of the other nodes' interest counts until discovery hears of the next connection
	}
	if state != wire.StateConnected && l.ev.NotConnected != nil {
		l.ev.NotConnected()
	}
}

// CredentialInUse records that a session with user runs, and tells
// OnCredential when the user is another than the last one in use.
func (l *Link) CredentialInUse(user string) {
	prev, prevState := l.Credential()
	l.ev.Perms.Accepted.Store(user, true)
	l.SetCredential(user, wire.CredentialInUse, "")
	l.ev.Metrics.SetRevoked(false)
	if prevState == wire.CredentialRevoked || prevState == wire.CredentialRefused {
		l.ev.Log.Info("broker credential accepted again", "user", user)
	}
	if (prev != user || prevState != wire.CredentialInUse) && l.ev.OnCredential != nil {
		l.ev.OnCredential(user)
	}
}

// CredentialRefused records that the broker refused a user at login; the
// first refusal of a user is logged (not every retry).
func (l *Link) CredentialRefused(e *CredentialRefusedError) {
	state, msg := wire.CredentialRefused, "broker credential refused: the broker refuses this node's user at login (a wrong password, or no such user on this broker); "
	if e.Revoked {
		state, msg = wire.CredentialRevoked, "broker credential revoked: the broker refuses this node's user, which it accepted before; "
	}
	if o := l.ev.URLOverride; o != "" {
		msg += "the broker URL comes from " + o + ", which overrides the bindings: fix the credential there; local work goes on and the node retries"
	} else {
		msg += "local work goes on, the node retries and takes a new credential from its bindings"
	}
	if l.SetCredential(e.User, state, e.Detail) {
		l.ev.Metrics.SetRevoked(true)
		l.ev.Log.Error(msg, "user", e.User, "reason", e.Detail)
	}
}
