package localnats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The server's store of MQTT retained messages, in its own format (the
// server's mqtt.go): the JetStream stream $MQTT_rmsgs of the account,
// one message per subject (MaxMsgsPerSubject 1) on $MQTT.rmsgs.<subject>,
// the payload as body and the rest in headers:
//
//	Nmqtt-RTopic   the MQTT topic (the server rebuilds it from the subject)
//	Nmqtt-RFlags   the publish's flags in hex (QoS << 1 | retain), with a
//	               leading '-' when the body is empty: the message clears
//	               the subject's retained message
//	Nmqtt-ROrigin  the server that stored it (its JetStream id); the
//	               server deletes the stream's copy of a clear only when
//	               it is its own
//	Nmqtt-RSource  the MQTT user (program) that published it
//
// The server reads the stream with a consumer of its own, from its start
// and then as messages come, and serves what it reads to later
// subscribers: a message published on $MQTT.rmsgs.<subject> in this format
// is the retained message of that subject, as if a device had published
// it on this server. Every store request crosses the account like a
// publish, so a subscriber on $MQTT.rmsgs.> also hears the server store
// its devices' retained publishes (after the server checked the device's
// right to publish the topic).
const (
	RetainedStream        = "$MQTT_rmsgs"
	RetainedSubjectPrefix = "$MQTT.rmsgs."

	retainedHdrTopic  = "Nmqtt-RTopic"
	retainedHdrFlags  = "Nmqtt-RFlags"
	retainedHdrOrigin = "Nmqtt-ROrigin"
	retainedHdrSource = "Nmqtt-RSource"
	retainedDelMarker = "-"
	retainFlag        = 0x1
)

// MeshOrigin is the origin the node gives the retained messages it puts
// into its server's store from the mesh: no server's JetStream id (a hash
// of letters and digits) has a colon, so the node tells its own copies
// from its devices' publishes by it.
const MeshOrigin = "meshbox:mesh"

// Retained is one retained message of the server's store.
type Retained struct {
	Subject string // the NATS subject (the MQTT topic with '.' for '/')
	Payload []byte // empty: the subject's retained message is cleared
	QoS     byte
	Origin  string // the server that stored it, or MeshOrigin
	Source  string // the MQTT user that published it ("" for none)
}

// Errors of decoding a retained message.
var ErrNotRetained = errors.New("not a retained message of the server's store")

// DecodeRetained reads a message of the server's store (from the stream or
// heard on $MQTT.rmsgs.>).
func DecodeRetained(subject string, h nats.Header, data []byte) (Retained, error) {
	subj, ok := strings.CutPrefix(subject, RetainedSubjectPrefix)
	if !ok || subj == "" {
		return Retained{}, fmt.Errorf("%w: subject %q", ErrNotRetained, subject)
	}
	flags := strings.TrimPrefix(h.Get(retainedHdrFlags), retainedDelMarker)
	f, err := strconv.ParseUint(flags, 16, 8)
	if err != nil || f >= 0x10 || (f>>1)&0x3 > 2 {
		return Retained{}, fmt.Errorf("%w: flags %q", ErrNotRetained, h.Get(retainedHdrFlags))
	}
	return Retained{Subject: subj, Payload: data, QoS: byte(f>>1) & 0x3,
		Origin: h.Get(retainedHdrOrigin), Source: h.Get(retainedHdrSource)}, nil
}

// EncodeRetained is the message that makes r the retained message of its
// subject in the server's store (an empty payload clears it), as the
// server itself writes one.
func EncodeRetained(r Retained) *nats.Msg {
	m := nats.NewMsg(RetainedSubjectPrefix + r.Subject)
	m.Data = r.Payload
	m.Header.Set(retainedHdrTopic, strings.ReplaceAll(r.Subject, ".", "/"))
	flags := strconv.FormatUint(uint64(r.QoS<<1|retainFlag), 16)
	if len(r.Payload) == 0 {
		flags = retainedDelMarker + flags
	}
	m.Header.Set(retainedHdrFlags, flags)
	if r.Origin != "" {
		m.Header.Set(retainedHdrOrigin, r.Origin)
	}
	if r.Source != "" {
		m.Header.Set(retainedHdrSource, r.Source)
	}
	return m
}

// EnsureRetainedStream makes the server's stream of retained messages
// when it has none yet, with the configuration the server gives it (it
// makes it at the first MQTT connection only) and maxBytes, a bound on
// what the stream holds (past it the oldest retained messages are
// dropped from the store); a stream the server made gets the bound too.
// Then a retained message put in before any device connected is there
// when one does.
func EnsureRetainedStream(ctx context.Context, js jetstream.JetStream, maxBytes int64) (jetstream.Stream, error) {
	st, err := js.Stream(ctx, RetainedStream)
	if err == nil {
		cfg := st.CachedInfo().Config
		if cfg.MaxBytes == maxBytes {
			return st, nil
		}
		cfg.MaxBytes = maxBytes
		if st, err = js.UpdateStream(ctx, cfg); err != nil {
			return nil, fmt.Errorf("bound stream %s: %w", RetainedStream, err)
		}
		return st, nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("look up stream %s: %w", RetainedStream, err)
	}
	st, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:              RetainedStream,
		Subjects:          []string{RetainedSubjectPrefix + ">"},
		Storage:           jetstream.FileStorage,
		Retention:         jetstream.LimitsPolicy,
		Replicas:          1,
		MaxMsgsPerSubject: 1,
		MaxBytes:          maxBytes,
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return EnsureRetainedStream(ctx, js, maxBytes) // the server made it meanwhile
	}
	if err != nil {
		return nil, fmt.Errorf("make stream %s: %w", RetainedStream, err)
	}
	return st, nil
}

// ErrRetainRefused: a retained message whose publisher may not publish
// its subject.
var ErrRetainRefused = errors.New("retained message refused")

// RetainAllowed reports whether the MQTT user source (a program; "" for a
// client without a credential) may publish subject, as the server checks
// a publish: nil when it may. A retained message in the server's store
// that fails it (written before the program's rights changed, or by a
// party that is not a device) is not the node's to spread.
func (r *Rights) RetainAllowed(source, subject string) error {
	if !server.IsValidLiteralSubject(subject) {
		return fmt.Errorf("%w: %q is not a literal subject", ErrRetainRefused, subject)
	}
	s := r.cur.Load()
	if s == nil {
		return fmt.Errorf("%w: no programs loaded", ErrRetainRefused)
	}
	if source == "" {
		if s.anonymous {
			return nil
		}
		return fmt.Errorf("%w: %s was published by a client without a credential, and this node takes none", ErrRetainRefused, subject)
	}
	allow, ok := s.publish[source]
	if !ok {
		return fmt.Errorf("%w: %s was published by %s, which is no program of this node (any more)", ErrRetainRefused, subject, source)
	}
	if !matchesAny(subject, allow) {
		return fmt.Errorf("%w: program %s may not publish %s", ErrRetainRefused, source, subject)
	}
	return nil
}
