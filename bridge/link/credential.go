package link

import (
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/meshbox/meshbox/internal/wire"
	amqp "github.com/rabbitmq/amqp091-go"
)

// This file is the link's credential: which broker user the link connects
// as, whether the broker refused it, and the state of a switch to a new
// credential without an outage (make before break: the Loop's
// handover).

// CredentialStatus describes the broker credential of the link.
type CredentialStatus struct {
	User       string    `json:"user"`
	Generation int       `json:"generation,omitempty"` // of a node's own broker user (BrokerUser); 0 otherwise
	State      string    `json:"state"`
	Since      time.Time `json:"since"`
	// SwitchedAt is when the link last moved to this credential from
	// another one while running (zero: it started with it).
	SwitchedAt time.Time `json:"switched_at,omitzero"`
	// Reason is the broker's answer while State is CredentialRevoked, or
	// why the last switch failed.
	Reason string `json:"reason,omitempty"`
}

// CredentialRefusedError means the broker refused the link's credential at
// login: the user does not exist (any more) or its password is wrong.
type CredentialRefusedError struct {
	User   string
	Detail string // the broker's reason
	// Revoked: the broker accepted this user before, in this process (a
	// rotation revoked it, or its user was deleted); otherwise the
	// password is wrong or the user never existed.
	Revoked bool
}

func (e *CredentialRefusedError) Error() string {
	if e.Revoked {
		return fmt.Sprintf("credential revoked: the broker refuses user %s at login, which it accepted before (%s)", e.User, e.Detail)
	}
	return fmt.Sprintf("credential refused: the broker refuses user %s at login: a wrong password, or no such user on this broker (%s)", e.User, e.Detail)
}

// Unwrap returns ErrCredentialRevoked.
func (e *CredentialRefusedError) Unwrap() error { return ErrCredentialRevoked }

// ErrCredentialRevoked is wrapped by a *CredentialRefusedError.
var ErrCredentialRevoked = errors.New("credential revoked")

// Refused returns a *CredentialRefusedError for a dial error that is the
// broker's 403 at login, else err. acceptedBefore says whether the broker
// accepted user before (then the refusal is a revocation).
func Refused(err error, user string, acceptedBefore func(user string) bool) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.AccessRefused {
		return &CredentialRefusedError{User: user, Detail: fmt.Sprintf("%d %s", ae.Code, ae.Reason), Revoked: acceptedBefore(user)}
	}
	return err
}

// credential is the link's record of its credential; Link.mu guards it.
type credential struct {
	user     string
	state    string
	since    time.Time
	switched time.Time
	reason   string
}

// CredentialStatus returns the credential in use, or the setting's user
// before the first session.
func (l *Link) CredentialStatus() CredentialStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.cred
	if c.user == "" {
		if u := l.inUseLocked(); u != "" {
			c.user = UserOf(u)
		} else if len(l.urls) > 0 {
			c.user = UserOf(l.urls[0]) // every URL of a list has the same user
		}
	}
	if c.state == "" {
		c.state = wire.CredentialUnused
	}
	_, gen, _ := wire.ParseBrokerUser(c.user)
	return CredentialStatus{User: c.user, Generation: gen, State: c.state, Since: c.since,
		SwitchedAt: c.switched, Reason: c.reason}
}

// Credential returns the user and state last recorded.
func (l *Link) Credential() (user, state string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cred.user, l.cred.state
}

// SetCredential records the state of user's credential. It reports whether
// the state changed; a move to user from another one in use marks a
// switch.
func (l *Link) SetCredential(user, state, reason string) (changed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cred.user == user && l.cred.state == state {
		l.cred.reason = reason
		return false
	}
	now := time.Now()
	if state == wire.CredentialInUse && l.cred.user != "" && l.cred.user != user {
		l.cred.switched = now
	}
	if l.cred.user != user && state != wire.CredentialInUse {
		l.cred.switched = time.Time{}
	}
	l.cred = credential{user: user, state: state, since: now, switched: l.cred.switched, reason: reason}
	return true
}

// BeginHandover makes Handing return a channel until EndHandover: a new
// session is being made.
func (l *Link) BeginHandover() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.handing == nil {
		l.handing = make(chan struct{})
	}
}

// EndHandover releases those waiting on Handing's channel.
func (l *Link) EndHandover() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.handing != nil {
		close(l.handing)
		l.handing = nil
	}
}

// Handing returns a channel closed when the handover under way ends; nil
// when there is none.
func (l *Link) Handing() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.handing
}

// AwaitHandover waits, at most wait or until quit is closed, for the
// handover under way to end; it returns at once when there is none.
func (l *Link) AwaitHandover(wait time.Duration, quit <-chan struct{}) {
	h := l.Handing()
	if h == nil {
		return
	}
	t := time.NewTimer(wait)
	select {
	case <-h:
	case <-t.C:
	case <-quit:
	}
	t.Stop()
}

// SameBroker reports whether two broker URLs name the same broker and
// vhost (they may differ in credential).
func SameBroker(a, b string) bool {
	ua, err1 := amqp.ParseURI(a)
	ub, err2 := amqp.ParseURI(b)
	return err1 == nil && err2 == nil && ua.Scheme == ub.Scheme && ua.Host == ub.Host &&
		ua.Port == ub.Port && ua.Vhost == ub.Vhost
}

// UserOf returns the user of a broker URL ("" if none or unparsable).
func UserOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return ""
	}
	return u.User.Username()
}

// PeerCredentials are the credential generations of other nodes, from the
// validated user_id of their system messages (discovery, heartbeats): the
// generation each node last spoke with. mu guards gen; the zero value is
// ready.
type PeerCredentials struct {
	mu  sync.Mutex
	gen map[string]int
}

// Seen records that node spoke with broker user user.
func (p *PeerCredentials) Seen(node, user string) {
	n, gen, ok := wire.ParseBrokerUser(user)
	if !ok || n != node {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gen == nil {
		p.gen = map[string]int{}
	}
	p.gen[node] = gen
}

// All returns the generation each node last spoke with.
func (p *PeerCredentials) All() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.gen))
	for n, g := range p.gen {
		out[n] = g
	}
	return out
}
