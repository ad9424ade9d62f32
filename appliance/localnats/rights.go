package localnats

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats-server/v2/server"
)

// A local client's word is input, never authority. The node acts on its
// own connections, which may do anything; so wherever a local client's
// message makes the node publish (the answer to a call, an error, the
// acknowledgement of a command, the result event of a command), the node
// first checks that the client could have done it itself:
//
//   - Answers go to a reply subject only when it is an inbox a party
//     allowed to send that message may receive on: under _INBOX., and,
//     when its second token names a program, that program must be allowed
//     to publish the message's subject (a program p receives only on
//     _INBOX.p.>). And every answer goes out on the node's responder
//     connection, whose credential may publish on _INBOX.> and nothing
//     else: whatever a check misses, the server refuses.
//   - A command's Meshbox-Result-Topic makes the node publish the
//     handler's result as an event: it is honoured only when every party
//     that may submit to the stage may publish that topic itself.
//
// The NATS server does not tell which connection published a message, so
// the checks take the union of the parties allowed to publish it (the
// node's own connections, the programs whose lists allow the subject, and
// clients without a credential on an open server). Programs that may
// publish the same subject can therefore aim answers at each other's
// inboxes; they cannot aim them anywhere else.

// Errors of the checks.
var (
	// ErrReplyRefused: a reply subject the sender may not receive on.
	ErrReplyRefused = errors.New("reply subject refused")
	// ErrResultTopicRefused: a result topic a submitter may not publish.
	ErrResultTopicRefused = errors.New("result topic refused")
	// ErrCallRefused: a node's own capability a program may not call.
	ErrCallRefused = errors.New("call refused")
)

const (
	inboxPrefix    = "_INBOX."
	responderAllow = "_INBOX.>"
)

// rightsSnapshot is what the local parties may publish, as loaded.
// Immutable once made.
type rightsSnapshot struct {
	anonymous bool
	// publish holds each program's publish allow list.
	publish map[string][]string
}

// Rights answers the bridge's, the blob server's and the tables'
// questions about local clients (bridge.LocalRights). It reads the
// snapshot the last (re)load of the programs made, without a lock. The
// zero value knows no programs and lets every reply through.
type Rights struct {
	cur atomic.Pointer[rightsSnapshot]
}

// set replaces the snapshot with the programs' lists and the server's
// openness.
func (r *Rights) set(progs []programs.Program, anonymous bool) {
	s := &rightsSnapshot{anonymous: anonymous, publish: make(map[string][]string, len(progs))}
	for _, p := range progs {
		s.publish[p.Name] = p.Permissions().Publish.Allow
	}
	r.cur.Store(s)
}

// ReplyAllowed reports whether the node may answer a message published on
// subject at reply (see above); nil when it may.
func (r *Rights) ReplyAllowed(subject, reply string) error {
	if err := checkInbox(reply); err != nil {
		return err
	}
	s := r.cur.Load()
	if s == nil || s.anonymous {
		return nil // anonymous clients may receive on any inbox
	}
	owner, rest, _ := strings.Cut(reply[len(inboxPrefix):], ".")
	allow, isProgram := s.publish[owner]
	if !isProgram {
		// Not a program's inbox: only the node's own connections may
		// subscribe there.
		return nil
	}
	if rest == "" {
		return fmt.Errorf("%w: %q: program %s receives only on %s%s.>", ErrReplyRefused, reply, owner, inboxPrefix, owner)
	}
	if !matchesAny(subject, allow) {
		return fmt.Errorf("%w: %q is program %s's inbox, and %s may not publish %s", ErrReplyRefused, reply, owner, owner, subject)
	}
	return nil
}

// CallAllowed reports whether the local client receiving on reply may
// call capability on a named node (node.<n>.cap.<capability>): micro
// discovery's capability answers the administrator (and the node's
// peers), never a program, whatever its call rights say; nil when it may.
func (r *Rights) CallAllowed(capability, reply string) error {
	if capability != microCap {
		return nil
	}
	if owner, ok := r.inboxOwner(reply); ok {
		return fmt.Errorf("%w: %s answers the node's administrator, not programs (program %s): ask with nats micro ls as the administrator", ErrCallRefused, capability, owner)
	}
	return nil
}

// inboxOwner returns the program whose inbox reply is in, if it is one's.
func (r *Rights) inboxOwner(reply string) (string, bool) {
	s := r.cur.Load()
	rest, ok := strings.CutPrefix(reply, inboxPrefix)
	if s == nil || !ok {
		return "", false
	}
	owner, _, _ := strings.Cut(rest, ".")
	_, isProgram := s.publish[owner]
	return owner, isProgram
}

// ResultTopicAllowed reports whether every local party that may submit to
// stage may also publish topic; nil when so.
func (r *Rights) ResultTopicAllowed(stage, topic string) error {
	s := r.cur.Load()
	if s == nil {
		return nil
	}
	cmd, evt := wire.CommandSubject(stage), wire.EventSubject(topic)
	for name, allow := range s.publish {
		if matchesAny(cmd, allow) && !matchesAny(evt, allow) {
			return fmt.Errorf("%w: program %s may submit to stage %s but may not publish topic %s", ErrResultTopicRefused, name, stage, topic)
		}
	}
	return nil
}

// checkInbox checks that reply is a literal subject under _INBOX. with a
// token after it.
func checkInbox(reply string) error {
	if !strings.HasPrefix(reply, inboxPrefix) || len(reply) == len(inboxPrefix) {
		return fmt.Errorf("%w: %q: the node answers only on inboxes (%s...)", ErrReplyRefused, reply, inboxPrefix)
	}
	if !server.IsValidLiteralSubject(reply) {
		return fmt.Errorf("%w: %q is not a literal subject", ErrReplyRefused, reply)
	}
	return nil
}

// matchesAny reports whether literal subject subj matches one of the
// patterns.
func matchesAny(subj string, patterns []string) bool {
	for _, p := range patterns {
		if server.SubjectMatchesFilter(subj, p) {
			return true
		}
	}
	return false
}
