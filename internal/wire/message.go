package wire

import "strings"

// What a message's ids and headers may be, on NATS and AMQP alike and in a
// node's outbox: the bridge checks every message it takes in against these,
// and the outbox every record it reads back, so that what one accepts the
// other accepts too.
const (
	MaxIDLen     = 128 // bytes of a message or correlation id
	MaxHeaderKey = 128 // bytes of a header key
)

// ValidID reports whether s can be a message or correlation id: 1 to
// MaxIDLen bytes of printable ASCII without spaces.
func ValidID(s string) bool {
	if s == "" || len(s) > MaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// ValidHeaderKey reports whether k can be a NATS header key: 1 to
// MaxHeaderKey bytes of printable ASCII without ':' or spaces.
func ValidHeaderKey(k string) bool {
	if k == "" || len(k) > MaxHeaderKey {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c >= 0x7f || c == ':' {
			return false
		}
	}
	return true
}

// ValidHeaderValue reports whether v can be a NATS header value: it holds
// no line break.
func ValidHeaderValue(v string) bool { return !strings.ContainsAny(v, "\r\n") }
