package wire

import (
	"fmt"
	"slices"
	"strings"

	"github.com/meshbox/meshbox/internal/names"
)

// Events travel on the broker under two keys at once. Their routing key
// is evt.<topic> (EventKey), which nodes of every version read; the
// publisher adds, as the message's BCC, the key of its own lane
// evo.<origin>.<topic> (EventOriginKey), which the broker routes like the
// routing key and takes off before delivery. A node binds its event queue
// to the lanes of the other nodes only, for the topics its programs
// subscribe to, and so never receives its own events back; it binds the
// shared evt.<pattern> keys too while a node of the mesh may publish
// nothing else (an older meshbox).

// EvoPrefix starts an event's lane key: evo.<origin>.<topic>.
const EvoPrefix = "evo."

// EventBCC is the AMQP header that carries an event's lane key: the
// broker routes by it as well and does not deliver it.
const EventBCC = "BCC"

// EventOriginKey is the lane key of an event of topic published by
// origin.
func EventOriginKey(origin, topic string) string { return EvoPrefix + origin + "." + topic }

// AllEvents is the topic pattern of every event (AMQP's "#").
const AllEvents = "#"

// EventPattern returns the AMQP topic pattern (after evt.) of the events
// a NATS subscription to subject receives, and whether it receives any:
// NATS "*" is AMQP "*" and ">" is "#". A subject that cannot match an
// event (another prefix, or a token no topic may hold) receives none. A
// subscription may match more than its pattern's events only by what
// AMQP's "#" adds (zero tokens): the node then receives events its
// program does not, never fewer.
func EventPattern(subject string) (string, bool) {
	toks := strings.Split(subject, ".")
	switch toks[0] {
	case ">":
		return AllEvents, true
	case "*", "evt":
	default:
		return "", false
	}
	rest := toks[1:]
	if len(rest) == 0 {
		return "", false // "evt" or "*": no topic is empty
	}
	for i, t := range rest {
		switch {
		case t == ">":
			if i != len(rest)-1 {
				return "", false
			}
			rest[i] = "#"
		case t == "*":
		case !validTopicToken(t):
			return "", false
		}
	}
	if len(rest) == 1 && rest[0] == "#" {
		return AllEvents, true
	}
	return strings.Join(rest, "."), true
}

// validTopicToken reports whether t may be a token of a topic
// (names.Topic: [A-Za-z0-9_-]).
func validTopicToken(t string) bool { return !strings.Contains(t, ".") && names.Topic(t) == nil }

// CoverPatterns returns patterns sorted, without duplicates, and without
// the patterns another of them covers (every key a covered one matches,
// the other matches too: "a" and "a.*" beside "a.#", everything beside
// "#").
func CoverPatterns(patterns []string) []string {
	var out []string
	for i, p := range patterns {
		covered := false
		for j, q := range patterns {
			if i != j && covers(q, p) && (!covers(p, q) || j < i) {
				covered = true // by q (of two equal ones, the first stays)
				break
			}
		}
		if !covered {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// covers reports whether AMQP topic pattern q matches every key pattern p
// matches.
func covers(q, p string) bool {
	return coversTokens(strings.Split(q, "."), strings.Split(p, "."))
}

func coversTokens(q, p []string) bool {
	if len(q) == 0 {
		return len(p) == 0
	}
	if q[0] == "#" {
		// Zero tokens of p, or one more (whatever it is).
		return coversTokens(q[1:], p) || (len(p) > 0 && coversTokens(q, p[1:]))
	}
	if len(p) == 0 || p[0] == "#" {
		return false
	}
	if q[0] != "*" && q[0] != p[0] {
		return false
	}
	return coversTokens(q[1:], p[1:])
}

// EventBindingKeys returns the keys node binds its event queue with for
// the topic patterns it is interested in: the lane of each peer for each
// pattern, and, when legacy, the shared key of each pattern (whose
// events include the node's own).
func EventBindingKeys(patterns, peers []string, node string, legacy bool) []string {
	var keys []string
	for _, p := range patterns {
		if legacy {
			keys = append(keys, EvtPrefix+p)
		}
		for _, peer := range peers {
			if peer != node {
				keys = append(keys, EvoPrefix+peer+"."+p)
			}
		}
	}
	slices.Sort(keys)
	return keys
}

// ValidEventPattern reports, as an error saying why not, whether p is a
// topic pattern a node may announce it listens to: what EventPattern
// returns, dot-separated tokens of a topic ([A-Za-z0-9_-]), "*" for one
// token, and "#" for any number as the last token (or alone), at most
// names.MaxDotted bytes.
func ValidEventPattern(p string) error {
	if p == "" || len(p) > names.MaxDotted {
		return fmt.Errorf("event pattern %.80q: empty or longer than %d bytes", p, names.MaxDotted)
	}
	toks := strings.Split(p, ".")
	for i, t := range toks {
		switch {
		case t == "#":
			if i != len(toks)-1 {
				return fmt.Errorf("event pattern %.80q: # only as the last token", p)
			}
		case t == "*":
		case !validTopicToken(t):
			return fmt.Errorf("event pattern %.80q: token %.40q is not a topic's (letters, digits, '-', '_'), * or #", p, t)
		}
	}
	return nil
}

// EventMatches reports whether the events of topic match AMQP topic
// pattern p (as the broker routes evt.<topic> to a binding evt.<p>);
// topic may be a pattern itself: then whether p matches every topic it
// matches.
func EventMatches(p, topic string) bool { return covers(p, topic) }

// EventMatcher reports whether events of a topic match any of a set of
// topic patterns, split once.
type EventMatcher struct{ pats [][]string }

// NewEventMatcher returns the matcher of patterns (AMQP syntax).
func NewEventMatcher(patterns []string) *EventMatcher {
	m := &EventMatcher{pats: make([][]string, len(patterns))}
	for i, p := range patterns {
		m.pats[i] = strings.Split(p, ".")
	}
	return m
}

// Matches reports whether some pattern matches topic.
func (m *EventMatcher) Matches(topic string) bool {
	if len(m.pats) == 0 {
		return false
	}
	t := strings.Split(topic, ".")
	for _, p := range m.pats {
		if coversTokens(p, t) {
			return true
		}
	}
	return false
}
