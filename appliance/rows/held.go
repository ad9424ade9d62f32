package rows

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Changes held for the future: a change stamped more than the clock's
// drift ahead of this node's clock waits until the clock reaches it. It
// waits on disk, in the table's held bucket (stamp, sequence -> JSON
// change), not in memory, and the saved offset moves past it, so a
// restart does not read its stretch of the log again. The bucket has a
// bound (maxHeldChanges, maxHeldBytes per table, a quarter of it per
// sender); a change past it, or
// stamped further ahead than any clock error (maxHoldAhead), is dropped
// and counted.

const (
	maxHeldChanges = 10_000
	maxHeldBytes   = 16 << 20
	// maxHoldAhead: a change stamped further ahead than this is no clock
	// error but a forgery or a broken clock; it is refused at once.
	maxHoldAhead = 24 * time.Hour
)

var (
	bHeld      = []byte("held")
	kHeld      = []byte("held")
	kHeldBytes = []byte("held_bytes")
	kVerifyTo  = []byte("verify_to")
	kVerifyAt  = []byte("verify_at")
	kLastHash  = []byte("last_hash")
)

// logApply is a run of a table's log to merge in one commit.
type logApply struct {
	changes []Change
	hold    []heldChange // stamped ahead: to the held bucket
	// progress is the meta key of the reader's position (kOffset for the
	// reader, kVerifyAt for the verifier) and next its new value.
	progress []byte
	next     uint64
	// lastHash is the SHA-256 of the last message's body (the reader's
	// runs): a node resuming the log checks it is still there.
	lastHash []byte
	// claims are versions a snapshot gave this node in another writer's
	// name; attest the changes whose versions strike claims off
	// (attest.go), recorded for claims still to come with recordAttest.
	claims       [][]byte
	attest       []Change
	recordAttest bool
}

// logApplied is what a logApply did.
type logApplied struct {
	applied []Applied
	held    int // changes now held
	dropped int // held changes over the bound, dropped
}

// applyLog merges a run of a table's log, holds the changes stamped
// ahead, and records the reader's position, in one committed transaction.
func (s *Store) applyLog(table string, run logApply) (logApplied, error) {
	var out logApplied
	err := s.update(func(tx *bolt.Tx) error {
		out = logApplied{} // update may run fn again
		cells, history, _, meta, err := tableBuckets(tx, table)
		if err != nil {
			return err
		}
		out.applied = make([]Applied, 0, len(run.changes))
		m := newMerger(cells, history, true)
		if len(run.changes) > 0 && m.after(run.changes[0].Row) {
			// Rows after the table's last (a joiner's snapshot): pages
			// filled, not split in halves that stay half empty.
			cells.FillPercent = 0.9
		}
		rows := 0 // the live rows' change, counted once
		for _, ch := range run.changes {
			a, d, err := m.merge(ch)
			if err != nil {
				return err
			}
			rows += d
			if a.n > 0 {
				a.Table = table
				out.applied = append(out.applied, a)
			}
		}
		if err := addCount(meta, kRows, rows); err != nil {
			return err
		}
		if len(run.claims) > 0 {
			if err := claim(tx, table, run.claims); err != nil {
				return err
			}
		}
		if len(run.attest) > 0 {
			if err := attest(tx, table, run.attest, run.recordAttest); err != nil {
				return err
			}
		}
		if len(run.hold) > 0 {
			if out.dropped, err = hold(tx, table, meta, run.hold); err != nil {
				return err
			}
		}
		out.held = getCount(meta, kHeld)
		if run.lastHash != nil {
			if err := meta.Put(kLastHash, run.lastHash); err != nil {
				return err
			}
		}
		return meta.Put(run.progress, binary.BigEndian.AppendUint64(nil, run.next))
	})
	return out, err
}

// heldChange is a change to hold and the node that sent it.
type heldChange struct {
	from string
	ch   Change
}

// hold puts changes into table's held bucket within its bounds, the
// table's and each sender's (a quarter of the table's: one writer whose
// stamps run ahead cannot crowd out another's), and returns how many it
// dropped. A held value is the sender's name (a byte of length, then the
// name) and the change's JSON.
func hold(tx *bolt.Tx, table string, meta *bolt.Bucket, changes []heldChange) (dropped int, err error) {
	tb := tx.Bucket([]byte(table))
	hb, err := tb.CreateBucketIfNotExists(bHeld)
	if err != nil {
		return 0, err
	}
	n, size := getCount(meta, kHeld), getCount(meta, kHeldBytes)
	for _, h := range changes {
		body, err := json.Marshal(h.ch)
		if err != nil {
			return dropped, err
		}
		if len(h.from) > 255 {
			dropped++
			continue
		}
		v := append(append([]byte{byte(len(h.from))}, h.from...), body...)
		kn, kb := senderKeys(h.from)
		sn, ss := getCount(meta, kn), getCount(meta, kb)
		if n+1 > maxHeldChanges || size+len(v) > maxHeldBytes || sn+1 > maxHeldChanges/4 || ss+len(v) > maxHeldBytes/4 {
			dropped++
			continue
		}
		seq, err := hb.NextSequence()
		if err != nil {
			return dropped, err
		}
		k := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, uint64(maxStamp(h.ch))), seq)
		if err := hb.Put(k, v); err != nil {
			return dropped, err
		}
		n, size = n+1, size+len(v)
		if err := setCount(meta, kn, sn+1); err != nil {
			return dropped, err
		}
		if err := setCount(meta, kb, ss+len(v)); err != nil {
			return dropped, err
		}
	}
	if err := setCount(meta, kHeld, n); err != nil {
		return dropped, err
	}
	return dropped, setCount(meta, kHeldBytes, size)
}

// senderKeys are the meta keys of the changes and bytes held for sender.
func senderKeys(sender string) (n, bytes []byte) {
	return []byte("held_n/" + sender), []byte("held_b/" + sender)
}

// unheld splits a held value into its sender and change, and takes it
// off the sender's counts.
func unheld(meta *bolt.Bucket, v []byte) (Change, string, error) {
	var ch Change
	if len(v) < 1 || len(v) < 1+int(v[0]) {
		return ch, "", errors.New("held change too short")
	}
	from := string(v[1 : 1+int(v[0])])
	kn, kb := senderKeys(from)
	if err := setCount(meta, kn, max(getCount(meta, kn)-1, 0)); err != nil {
		return ch, from, err
	}
	if err := setCount(meta, kb, max(getCount(meta, kb)-len(v), 0)); err != nil {
		return ch, from, err
	}
	return ch, from, json.Unmarshal(v[1+int(v[0]):], &ch)
}

// maxStamp is the newest stamp of ch's cells.
func maxStamp(ch Change) Stamp {
	var m Stamp
	for _, c := range ch.Cells {
		m = max(m, c.Stamp)
	}
	return m
}

// nextHeld returns the stamp of table's first held change (0: none).
func (s *Store) nextHeld(table string) (Stamp, error) {
	var st Stamp
	err := s.db.View(func(tx *bolt.Tx) error {
		if hb := sub(tx, table, bHeld); hb != nil {
			if k, _ := hb.Cursor().First(); len(k) == 16 {
				st = Stamp(binary.BigEndian.Uint64(k))
			}
		}
		return nil
	})
	return st, err
}

// releaseHeld merges table's held changes stamped at or before upTo
// (observe moves the clock past each first) and removes them; it
// returns what won and the stamp of the first change still held.
func (s *Store) releaseHeld(table string, upTo Stamp, observe func(Change) error) ([]Applied, Stamp, error) {
	var out []Applied
	var next Stamp
	err := s.update(func(tx *bolt.Tx) error {
		out, next = nil, 0
		hb := sub(tx, table, bHeld)
		if hb == nil {
			return nil
		}
		cells, history, _, meta, err := tableBuckets(tx, table)
		if err != nil {
			return err
		}
		n, size := getCount(meta, kHeld), getCount(meta, kHeldBytes)
		m := newMerger(cells, history, false)
		var done [][]byte
		cur := hb.Cursor()
		for k, v := cur.First(); k != nil; k, v = cur.Next() {
			if len(k) != 16 || Stamp(binary.BigEndian.Uint64(k)) > upTo {
				if len(k) == 16 {
					next = Stamp(binary.BigEndian.Uint64(k))
				}
				break
			}
			done = append(done, append([]byte(nil), k...))
			n, size = n-1, size-len(v)
			ch, _, err := unheld(meta, v)
			if err != nil || ch.Table != table || observe(ch) != nil {
				continue // damaged, or the clock still refuses it: dropped
			}
			a, err := m.putChange(meta, ch)
			if err != nil {
				return err
			}
			if a.n > 0 {
				a.Table = table
				out = append(out, a)
			}
		}
		for _, k := range done {
			if err := hb.Delete(k); err != nil {
				return err
			}
		}
		if err := setCount(meta, kHeld, max(n, 0)); err != nil {
			return err
		}
		return setCount(meta, kHeldBytes, max(size, 0))
	})
	return out, next, err
}

// heldCount returns how many changes table holds for the future.
func (s *Store) heldCount(table string) int {
	n := 0
	_ = s.db.View(func(tx *bolt.Tx) error {
		if m := sub(tx, table, bMeta); m != nil {
			n = getCount(m, kHeld)
		}
		return nil
	})
	return n
}

// verifyRange returns the stretch of table's log the verifier has yet to
// read (verify.go): from at up to (not including) to; ok false: none.
func (s *Store) verifyRange(table string) (at, to uint64, ok bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		m := sub(tx, table, bMeta)
		if m == nil {
			return nil
		}
		t, a := m.Get(kVerifyTo), m.Get(kVerifyAt)
		if len(t) == 8 {
			to, ok = binary.BigEndian.Uint64(t), true
		}
		if len(a) == 8 {
			at = binary.BigEndian.Uint64(a)
		}
		return nil
	})
	return at, to, ok, err
}

// setVerify records that table's log before to is to be verified (0: the
// stretch is done and forgotten).
func (s *Store) setVerify(table string, to uint64) error {
	return s.update(func(tx *bolt.Tx) error {
		_, _, _, meta, err := tableBuckets(tx, table)
		if err != nil {
			return err
		}
		if to == 0 {
			if err := meta.Delete(kVerifyTo); err != nil {
				return err
			}
			return meta.Delete(kVerifyAt)
		}
		if err := meta.Put(kVerifyAt, binary.BigEndian.AppendUint64(nil, 0)); err != nil {
			return err
		}
		return meta.Put(kVerifyTo, binary.BigEndian.AppendUint64(nil, to))
	})
}

// lastHash returns the hash of the last message of table's log this node
// applied (nil: none recorded).
func (s *Store) lastHash(table string) ([]byte, error) {
	var h []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		if m := sub(tx, table, bMeta); m != nil {
			if v := m.Get(kLastHash); len(v) == 32 {
				h = append([]byte(nil), v...)
			}
		}
		return nil
	})
	return h, err
}

// forgetOffset forgets where this node read table's log (its log was
// replaced): the next reader starts as a node new to it.
func (s *Store) forgetOffset(table string) error {
	return s.update(func(tx *bolt.Tx) error {
		m := sub(tx, table, bMeta)
		if m == nil {
			return nil
		}
		for _, k := range [][]byte{kOffset, kLastHash, kVerifyTo, kVerifyAt} {
			if err := m.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}
