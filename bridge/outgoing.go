package bridge

import (
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/meshbox/meshbox/internal/seal"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
)

// This file is the outgoing side of the envelope: a message on its way to
// the broker and the AMQP message it becomes (sealed in a mesh that
// seals, sealing.go). The incoming side, decoding and validating what
// the broker delivers, is envelope.go.

// outgoing is a message on its way to the broker.
type outgoing struct {
	exchange  string
	key       string
	mandatory bool
	kind      string
	msgID     string
	corrID    string
	replyTo   string
	expire    time.Duration // requests: time left until the deadline
	persist   bool
	header    nats.Header       // caller headers (see callerHeaders)
	meta      map[string]string // Meshbox-* headers the node sets
	body      []byte
	at        time.Time
	raw       *amqp.Publishing // when set: published as it is
	scope     string           // replies: sealed with this scope's key (the request's)
	// route, when set, is the routing key the message is published with
	// while key stays the one it is sealed for: a retry copy is sealed for
	// cmd.<stage>, where the retry queue sends it back, and routed to
	// retry.<stage>.
	route string
	// ttl, when set, is the message's expiration (a retry copy's backoff).
	ttl time.Duration
	// batch, when set, is how many commands the message carries (a batch
	// built by packCommands, in raw).
	batch int
	// bare: the message goes out with no properties and no body (a
	// probe, probe.go).
	bare bool
}

// routingKey is the key o is published with.
func (o *outgoing) routingKey() string {
	if o.route != "" {
		return o.route
	}
	return o.key
}

// expiration is the AMQP expiration property of o: the request's time
// left or the retry copy's backoff, in milliseconds ("": none).
func (o *outgoing) expiration() string {
	d := o.expire
	if o.ttl > 0 {
		d = o.ttl
	}
	if d <= 0 {
		return ""
	}
	return strconv.FormatInt(max(1, d.Milliseconds()), 10)
}

// publishing builds the AMQP message of node origin, published by broker
// user user (the user_id property: the broker refuses it from any other
// user, and receivers take the origin from it). With keys (a mesh that
// seals), a program's message is sealed (sealing.go); it fails only when
// keys holds no key to seal with.
func (o *outgoing) publishing(origin, user string, keys *seal.Keyring) (amqp.Publishing, error) {
	if o.bare {
		return amqp.Publishing{}, nil
	}
	if o.raw != nil {
		p := *o.raw
		p.UserId = user
		return p, nil
	}
	if keys != nil && sealable(o.kind) {
		return o.sealedPublishing(origin, user, keys)
	}
	t := make(amqp.Table, len(o.header)+len(o.meta)+1)
	var ctype, cenc string
	for k, vs := range o.header {
		if len(vs) == 0 {
			continue
		}
		switch {
		case strings.EqualFold(k, headerContentType):
			ctype = vs[0]
			continue
		case strings.EqualFold(k, headerContentEncoding):
			cenc = vs[0]
			continue
		}
		if len(vs) == 1 {
			t[k] = vs[0]
			continue
		}
		arr := make([]any, len(vs))
		for i, v := range vs {
			arr[i] = v
		}
		t[k] = arr
	}
	for k, v := range o.meta {
		t[k] = v
	}
	p := o.readable(t, origin, user)
	p.ContentType, p.ContentEncoding, p.Body = ctype, cenc, o.body
	return p, nil
}

// readable is the part of o's AMQP message that stays readable sealed or
// not: the headers t (with Meshbox-Origin where it counts), ids,
// reply-to, type, timestamp, user_id, delivery mode and expiration.
func (o *outgoing) readable(t amqp.Table, origin, user string) amqp.Publishing {
	setOriginHeader(t, origin, user)
	p := amqp.Publishing{
		Headers:       t,
		MessageId:     o.msgID,
		CorrelationId: o.corrID,
		ReplyTo:       o.replyTo,
		Type:          o.kind,
		Timestamp:     o.at,
		UserId:        user,
		Expiration:    o.expiration(),
	}
	if o.persist {
		p.DeliveryMode = amqp.Persistent
	}
	return p
}

// sealedPublishing builds the sealed AMQP message: only what routing needs
// stays readable (type, routing key, ids, reply-to, expiration, timestamp,
// user_id, and the node's Meshbox-* headers but the timeout, which is
// sealed with the deadline).
func (o *outgoing) sealedPublishing(origin, user string, keys *seal.Keyring) (amqp.Publishing, error) {
	t := make(amqp.Table, len(o.meta)+2)
	for k, v := range o.meta {
		if k != HeaderTimeout && k != HeaderResultTopic {
			t[k] = v
		}
	}
	if topic := o.meta[HeaderResultTopic]; topic != "" && o.kind == typeCommand {
		// Sealed with the command, so that nobody on the way can send its
		// result elsewhere (results.go).
		sealed := *o
		sealed.header = make(nats.Header, len(o.header)+1)
		maps.Copy(sealed.header, o.header)
		sealed.header[HeaderResultTopic] = []string{topic}
		o = &sealed
	}
	p := o.readable(t, origin, user)
	if err := o.sealInto(&p, keys, origin); err != nil {
		return amqp.Publishing{}, err
	}
	return p, nil
}

// setOriginHeader sets Meshbox-Origin in t, where it counts: in a mesh
// run on one credential. A node's own broker user is its origin already
// (the receiver reads it from user_id, origin.go), and every header costs
// the broker work on each message: measured with raw clients on a 2-core
// machine, three headers instead of one added about 10 µs to a request's
// round trip.
func setOriginHeader(t amqp.Table, origin, user string) {
	if _, _, ok := ParseBrokerUser(user); !ok {
		t[HeaderOrigin] = origin
	}
}
