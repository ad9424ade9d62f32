package appliance

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/meshbox/meshbox/appliance/localnats"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats-server/v2/server"
)

// The row of a topic: every write sets subject, qos and source, and sets
// or deletes each payload part, all with one stamp, so that every field of
// a row converges to the same write. A clear sets the payload parts
// deleted: the row keeps the subject (a row whose key is a hash names its
// topic only there).
const (
	retainedFieldSubject = "subject"
	retainedFieldQoS     = "qos"
	retainedFieldSource  = "source"
	retainedFieldPayload = "payload" // the first part; then payload_1, payload_2
	retainedParts        = 3
)

// DefaultMQTTRetainedMaxBytes is the default bound of the node's store of
// MQTT retained messages (nats_mqtt_retained_max_bytes).
const DefaultMQTTRetainedMaxBytes = 64 << 20

const (
	minMQTTRetainedBytes = 1 << 20
	maxMQTTRetainedBytes = 1 << 40
)

// MaxRetainedPayload is the largest retained payload the mesh carries (a
// row's payload parts); a larger one stays on its node, refused as
// too_large.
const MaxRetainedPayload = retainedParts * rows.MaxValueLen

func retainedPart(i int) string {
	if i == 0 {
		return retainedFieldPayload
	}
	return retainedFieldPayload + "_" + strconv.Itoa(i)
}

// retainedRow is the row key of subject: the subject itself where it is
// a row key (and does not start with '='), else '=' and its SHA-256.
func retainedRow(subject string) string {
	if !strings.HasPrefix(subject, "=") && rows.ValidRow(subject) == nil {
		return subject
	}
	sum := sha256.Sum256([]byte(subject))
	return "=" + hex.EncodeToString(sum[:])
}

// retainedWrite is the write of r's row.
func retainedWrite(r localnats.Retained) (set map[string][]byte, del []string) {
	set = map[string][]byte{
		retainedFieldSubject: []byte(r.Subject),
		retainedFieldQoS:     []byte(strconv.Itoa(int(r.QoS))),
		retainedFieldSource:  []byte(r.Source),
	}
	p := r.Payload
	for i := range retainedParts {
		if len(p) == 0 {
			del = append(del, retainedPart(i))
			continue
		}
		n := min(len(p), rows.MaxValueLen)
		set[retainedPart(i)] = p[:n]
		p = p[n:]
	}
	return set, del
}

// retainedFields are the fields every write of a row sets or deletes.
var retainedFields = func() []string {
	f := []string{retainedFieldSubject, retainedFieldQoS, retainedFieldSource}
	for i := range retainedParts {
		f = append(f, retainedPart(i))
	}
	return f
}()

// retainedSubjectOK reports why subject cannot be a retained message of
// the mesh (nil: it can): an event's subject (evt.), literal (no empty
// token, no wildcard), valid UTF-8 without control characters or white
// space (which no MQTT topic the server takes has).
func retainedSubjectOK(subject string) error {
	if !strings.HasPrefix(subject, wire.EvtPrefix) {
		return fmt.Errorf("subject %q is not an event's", subject)
	}
	if !utf8.ValidString(subject) {
		return fmt.Errorf("subject %q is not UTF-8", subject)
	}
	for i := 0; i < len(subject); i++ {
		if c := subject[i]; c <= ' ' || c == 0x7f {
			return fmt.Errorf("subject %q holds a control character or white space", subject)
		}
	}
	if !server.IsValidLiteralSubject(subject) {
		return fmt.Errorf("subject %q is not a literal subject", subject)
	}
	return nil
}

// retainedOf reads a row: the retained message it holds (an empty payload
// when cleared) and the version of its write, which names the writer.
//
// A row is one write: every field a write names (subject, qos, source,
// each payload part, set or deleted) must carry the same stamp and node.
// A row whose fields come from different writes (a peer that wrote some
// fields only, over another node's write) is refused as a whole, under
// bad_row, and attributed to the writer of its newest field: taking the
// fields one by one would mix two writes and name the wrong writer. The
// next whole write of the topic (a later retain) replaces it.
func retainedOf(row string, cells map[string]rows.Cell) (localnats.Retained, rows.Cell, error) {
	sc, ok := cells[retainedFieldSubject]
	newest := sc
	for _, f := range retainedFields {
		if c, ok := cells[f]; ok && c.Wins(newest) {
			newest = c
		}
	}
	if !ok || sc.Deleted {
		return localnats.Retained{}, newest, fmt.Errorf("row %s has no subject", row)
	}
	for _, f := range retainedFields {
		c, ok := cells[f]
		if !ok {
			return localnats.Retained{}, newest, fmt.Errorf("row %s lacks field %s: no whole write", row, f)
		}
		if c.Stamp != sc.Stamp || c.Node != sc.Node {
			return localnats.Retained{}, newest, fmt.Errorf("row %s: field %s was written by %s at %d, its subject by %s at %d: fields of different writes", row, f, c.Node, c.Stamp, sc.Node, sc.Stamp)
		}
	}
	r := localnats.Retained{Subject: string(sc.Value)}
	if retainedRow(r.Subject) != row {
		return r, sc, fmt.Errorf("row %s names subject %q, which is not its own", row, r.Subject)
	}
	if err := retainedSubjectOK(r.Subject); err != nil {
		return r, sc, fmt.Errorf("row %s: %w", row, err)
	}
	if q := cells[retainedFieldQoS]; !q.Deleted {
		n, err := strconv.Atoi(string(q.Value))
		if err != nil || n < 0 || n > 2 {
			return r, sc, fmt.Errorf("row %s: qos %q is not 0, 1 or 2", row, q.Value)
		}
		r.QoS = byte(n)
	}
	if s := cells[retainedFieldSource]; !s.Deleted {
		r.Source = string(s.Value)
	}
	for i := range retainedParts {
		c := cells[retainedPart(i)]
		if c.Deleted {
			break
		}
		r.Payload = append(r.Payload, c.Value...)
	}
	return r, sc, nil
}

// sameRetained reports whether a and b hold the same retained message
// (two clears are the same whatever their QoS).
func sameRetained(a, b localnats.Retained) bool {
	if len(a.Payload) == 0 || len(b.Payload) == 0 {
		return len(a.Payload) == len(b.Payload)
	}
	return a.QoS == b.QoS && bytes.Equal(a.Payload, b.Payload)
}

func retainedHash(r localnats.Retained) [sha256.Size]byte {
	if len(r.Payload) == 0 {
		return sha256.Sum256(nil)
	}
	return sha256.Sum256(append([]byte{r.QoS}, r.Payload...))
}
