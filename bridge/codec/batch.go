package codec

import (
	"encoding/binary"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	// TypeCommandBatch is the AMQP type of a batch message.
	TypeCommandBatch = "commands"
	BatchVersion     = 1
	// DefaultCommandBatch is the most commands one message carries.
	DefaultCommandBatch = 4
	// MaxCommandBatch bounds Config.CommandBatch.
	MaxCommandBatch = 64
)

// BatchLimit is the largest body a batch may have, for a node with
// maxPayload: a command at the limit travels alone.
func BatchLimit(maxPayload int) int { return maxPayload + MaxHeaderBytes + SealSlack }

// EntrySize bounds the encoded size of p as a batch entry.
func EntrySize(p *amqp.Publishing) int {
	n := 5*binary.MaxVarintLen64 + len(p.MessageId) + len(p.ContentType) + len(p.ContentEncoding) + len(p.Body)
	for k, v := range p.Headers {
		n += 2*binary.MaxVarintLen64 + len(k)
		switch v := v.(type) {
		case string:
			n += binary.MaxVarintLen64 + len(v)
		case []any:
			for _, x := range v {
				if s, ok := x.(string); ok {
					n += binary.MaxVarintLen64 + len(s)
				}
			}
		}
	}
	return n
}

// EncodeBatch encodes the messages ps (built by outgoing.publishing) as a
// batch body; size is a bound of its length.
func EncodeBatch(ps []amqp.Publishing, size int) []byte {
	buf := make([]byte, 0, size)
	buf = append(buf, BatchVersion)
	buf = binary.AppendUvarint(buf, uint64(len(ps)))
	for i := range ps {
		p := &ps[i]
		buf = AppendStr(buf, p.MessageId)
		buf = binary.AppendVarint(buf, p.Timestamp.UnixMilli())
		buf = AppendStr(buf, p.ContentType)
		buf = AppendStr(buf, p.ContentEncoding)
		n := 0
		for _, v := range p.Headers {
			if _, ok := StringHeader(v); ok {
				n++
			}
		}
		buf = binary.AppendUvarint(buf, uint64(n))
		for k, v := range p.Headers {
			count, ok := StringHeader(v)
			if !ok {
				continue
			}
			buf = AppendStr(buf, k)
			buf = binary.AppendUvarint(buf, uint64(count))
			switch v := v.(type) {
			case string:
				buf = AppendStr(buf, v)
			case []any:
				for _, x := range v {
					buf = AppendStr(buf, x.(string))
				}
			}
		}
		buf = binary.AppendUvarint(buf, uint64(len(p.Body)))
		buf = append(buf, p.Body...)
	}
	return buf
}

// StringHeader reports whether v is a header value as outgoing.publishing
// builds them (a string, or a list of strings), and how many strings it
// holds. Publishing never makes another kind; one would be left out.
func StringHeader(v any) (n int, ok bool) {
	switch v := v.(type) {
	case string:
		return 1, true
	case []any:
		for _, x := range v {
			if _, ok := x.(string); !ok {
				return 0, false
			}
		}
		return len(v), true
	}
	return 0, false
}

// DecodeBatch splits the batch delivery d into the deliveries of its
// commands, each as it would have come alone: d's routing key, user_id,
// redelivery and delivery tag, the broker's delivery count, and the
// entry's own id, timestamp, headers and body (which shares d's). It
// accepts at most maxEntries commands in at most limit bytes, and never
// panics, whatever the body holds.
func DecodeBatch(d *amqp.Delivery, maxEntries, limit int) ([]amqp.Delivery, error) {
	if len(d.Body) > limit {
		return nil, Bad("command batch of %d bytes exceeds the limit of %d", len(d.Body), limit)
	}
	if len(d.Body) == 0 || d.Body[0] != BatchVersion {
		return nil, Bad("command batch of an unknown format")
	}
	r := SealReader{B: d.Body[1:]}
	n := r.Uvarint()
	if r.Err == nil && (n < 1 || n > uint64(maxEntries)) {
		return nil, Bad("command batch of %d commands, want 1..%d", n, maxEntries)
	}
	count, isCount := d.Headers[HeaderDeliveryCount]
	out := make([]amqp.Delivery, 0, n)
	for i := uint64(0); i < n && r.Err == nil; i++ {
		e := amqp.Delivery{
			Type: TypeCommand, RoutingKey: d.RoutingKey, Exchange: d.Exchange, UserId: d.UserId,
			Redelivered: d.Redelivered, DeliveryTag: d.DeliveryTag, DeliveryMode: d.DeliveryMode,
			ConsumerTag: d.ConsumerTag, Acknowledger: d.Acknowledger,
		}
		e.MessageId = r.Str()
		e.Timestamp = time.UnixMilli(r.Varint())
		e.ContentType = r.Str()
		e.ContentEncoding = r.Str()
		nkeys := r.Uvarint()
		if r.Err == nil && nkeys > uint64(len(r.B)) {
			return nil, Bad("command batch entry %d: header count %d", i, nkeys)
		}
		e.Headers = make(amqp.Table, nkeys+1)
		for j := uint64(0); j < nkeys && r.Err == nil; j++ {
			k := r.Str()
			nv := r.Uvarint()
			if r.Err != nil || nv > uint64(len(r.B)) || nv == 0 {
				if r.Err == nil {
					return nil, Bad("command batch entry %d: header %q with %d values", i, k, nv)
				}
				break
			}
			if IsBrokerHeader(k) {
				k = "" // a publisher's x-* header never counts (see below)
			}
			if nv == 1 {
				v := r.Str()
				if k != "" {
					e.Headers[k] = v
				}
				continue
			}
			vs := make([]any, 0, nv)
			for range nv {
				vs = append(vs, r.Str())
			}
			if k != "" {
				e.Headers[k] = vs
			}
		}
		size := r.Uvarint()
		if r.Err == nil && size > uint64(len(r.B)) {
			r.Err = ErrShortSealed
		}
		if r.Err != nil {
			break
		}
		e.Body = r.B[:size:size]
		r.B = r.B[size:]
		if isCount {
			// The broker's count of the batch's deliveries is each
			// command's: a publisher cannot make one look like a retry.
			e.Headers[HeaderDeliveryCount] = count
		}
		out = append(out, e)
	}
	if r.Err != nil {
		return nil, Bad("command batch: %v", r.Err)
	}
	if len(r.B) != 0 {
		return nil, Bad("command batch: %d bytes after its last command", len(r.B))
	}
	return out, nil
}

// CmdAck is how one command of a delivery is settled: the delivery's tag,
// and for a command of a batch the batch's count of commands not settled
// yet.
type CmdAck struct {
	Tag   uint64
	Batch *BatchLeft // nil: the delivery is this command alone
}

// BatchLeft counts the commands of one batch delivery not settled yet.
type BatchLeft struct {
	N       atomic.Int32
	Requeue atomic.Bool // a command that no one here can open: the batch goes back whole
}
