package rows

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/seal"
	"github.com/meshbox/meshbox/internal/wire"
)

// A message of a table's log (its stream queue, rows.<table>) is one
// sealed batch: a node's writes, or a part of a snapshot of the whole
// table. The broker sees the table (the routing key), the key id, the
// publisher's broker user and the size; nothing else.
const (
	kindChanges  = "changes"
	kindSnapshot = "snapshot"

	// Headers of a log message (plain: the broker and readers see them).
	headerKey      = wire.HeaderKey      // the content key it is sealed with
	headerSnapshot = wire.HeaderRowsSnap // offset a node new to the log reads from: the newest complete snapshot the writer knew, and the changes it may lack
	headerOffset   = "x-stream-offset"   // set by RabbitMQ on every delivery of a stream
)

// batch is a log message's plaintext.
type batch struct {
	V     int    `json:"v"`
	Kind  string `json:"kind"`
	Node  string `json:"node"`
	Snap  string `json:"snap,omitempty"`  // snapshot id
	Part  int    `json:"part,omitempty"`  // snapshot part, from 1
	Parts int    `json:"parts,omitempty"` // snapshot parts
	// Join is the offset a node new to the log reads from, as the
	// writer knew it: where the newest complete snapshot starts (in a
	// snapshot's last part, that snapshot's own start). Sealed, unlike
	// the header that says the same for nodes of earlier versions: a
	// joining node trusts only this, and only from a message that
	// opens and names an offset before its own.
	Join    uint64   `json:"join,omitempty"`
	Changes []Change `json:"changes"`
	// From is, in a snapshot's parts, the offset of the log its writer
	// was to read next when it took the snapshot: every change before it
	// is in the snapshot, those from it on may not be (they were on their
	// way to the writer) and are read from the log.
	From uint64 `json:"from,omitempty"`
}

// Bounds of a snapshot's id and parts (a part holds about 256 KiB: a
// table of 64 GiB).
const (
	maxSnapID        = 128
	maxSnapshotParts = 1 << 18
)

// QueueOf is the stream queue (and routing key on the mesh exchange) of
// table's log.
func QueueOf(table string) string { return "rows." + table }

func sealAD(table, keyID string) []byte {
	return seal.AssociatedData(nil, "meshbox rows v1", table, keyID)
}

// sealBatch seals b for table with sealer: in binary a snapshot's part
// of version 2 (binpart.go), anything else in JSON.
func sealBatch(s *seal.Sealer, table string, b *batch) ([]byte, error) {
	if b.V == snapshotV {
		if b.Kind != kindSnapshot {
			return nil, fmt.Errorf("a batch of kind %q in binary", b.Kind)
		}
		return s.Seal(nil, sealAD(table, s.ID()), appendBinaryPart(nil, b)), nil
	}
	pt, err := json.Marshal(b)
	if err != nil {
		return nil, err
	}
	return s.Seal(nil, sealAD(table, s.ID()), pt), nil
}

// OpenLog opens a message of table's log, sealed with key keyID (its
// Meshbox-Key header), with the keys in ring, as a reader of the log
// does, and returns the ids of the rows it changes. It is for a party
// that holds keys outside a running node: an audit, or a test playing
// the holder of a removed node's files.
func OpenLog(ring *seal.Keyring, table, keyID string, body []byte) ([]string, error) {
	b, err := openBatch(nil, ring, table, keyID, body)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(b.Changes))
	for _, ch := range b.Changes {
		ids = append(ids, ch.Row)
	}
	return ids, nil
}

// errUnopened wraps a log message this node cannot open.
var errUnopened = errors.New("does not open")

// openBatch opens a log message of table sealed with key keyID and
// checks what it carries. The plaintext goes to dst as with
// cipher.AEAD.Open: a reader passes body[:0], opening the message in its
// own bytes, not a copy (a joiner's 25 MB of snapshot allocated and
// cleared again were a fifth of its opening); the body is then gone.
func openBatch(dst []byte, ring *seal.Keyring, table, keyID string, body []byte) (*batch, error) {
	if keyID == "" {
		return nil, fmt.Errorf("%w: not sealed (no %s header)", errUnopened, headerKey)
	}
	pt, err := ring.Open(dst, keyID, sealAD(table, keyID), body)
	if err != nil {
		return nil, fmt.Errorf("%w: key %s: %v", errUnopened, keyID, err)
	}
	var b batch
	if len(pt) > 0 && pt[0] == binaryPart {
		if err := decodeBinaryPart(pt, table, &b); err != nil {
			return nil, fmt.Errorf("%w: %v", errUnopened, err)
		}
		if b.V != snapshotV || b.Kind != kindSnapshot {
			return nil, fmt.Errorf("%w: binary version %d kind %q", errUnopened, b.V, b.Kind)
		}
	} else if err := decodeBatch(pt, &b); err != nil {
		return nil, fmt.Errorf("%w: %v", errUnopened, err)
	} else if b.V != 1 {
		return nil, fmt.Errorf("%w: version %d in JSON", errUnopened, b.V)
	}
	if b.Kind != kindChanges && b.Kind != kindSnapshot {
		return nil, fmt.Errorf("%w: version %d kind %q", errUnopened, b.V, b.Kind)
	}
	if err := names.Node(b.Node); err != nil {
		return nil, fmt.Errorf("%w: sender: %v", errUnopened, err)
	}
	if b.Kind == kindSnapshot && (b.Snap == "" || len(b.Snap) > maxSnapID || b.Part < 1 || b.Part > b.Parts || b.Parts > maxSnapshotParts) {
		return nil, fmt.Errorf("%w: snapshot %.64q part %d of %d out of bounds", errUnopened, b.Snap, b.Part, b.Parts)
	}
	for _, ch := range b.Changes {
		if ch.Table != table {
			return nil, fmt.Errorf("%w: a change of table %q in the log of %q", errUnopened, ch.Table, table)
		}
		if err := ValidRow(ch.Row); err != nil {
			return nil, fmt.Errorf("%w: %v", errUnopened, err)
		}
		if !ch.Cells.inOrder() {
			return nil, fmt.Errorf("%w: row %s: %v", errUnopened, ch.Row, errCellsOrder)
		}
		for _, c := range ch.Cells {
			f := c.Field
			if err := ValidField(f); err != nil {
				return nil, fmt.Errorf("%w: %v", errUnopened, err)
			}
			// A node's name in UTF-8: JSON carries nothing else, and a
			// binary part must not hold a version JSON would change.
			if len(c.Value) > MaxValueLen || c.Node == "" || len(c.Node) > 255 || !utf8.ValidString(c.Node) {
				return nil, fmt.Errorf("%w: field %s: value of %d bytes or node %q out of bounds", errUnopened, f, len(c.Value), c.Node)
			}
			// A tombstone has no value: one with a value would be kept
			// (a member's padding of every replica) and never read.
			if c.Deleted && len(c.Value) > 0 {
				return nil, fmt.Errorf("%w: field %s: deleted, with a value of %d bytes", errUnopened, f, len(c.Value))
			}
		}
	}
	return &b, nil
}
