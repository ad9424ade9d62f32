package rows

import (
	"encoding/binary"
	"encoding/json"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Changes held for the future: a change stamped more than the clock's
// drift ahead of this node's clock waits until the clock reaches it. It
// waits on disk, in the table's held bucket (stamp, sequence -> JSON
// change), not in memory, and the saved offset moves past it, so a
// restart does not read its stretch of the log again. The bucket has a
// bound (maxHeldChanges, maxHeldBytes per table); a change past it, or
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
)

// logApply is a run of a table's log to merge in one commit.
type logApply struct {
	changes []Change
	hold    []Change // stamped ahead: to the held bucket
	// progress is the meta key of the reader's position (kOffset for the
	// reader, kVerifyAt for the verifier) and next its new value.
	progress []byte
	next     uint64
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
		for _, ch := range run.changes {
			won, err := putChange(cells, history, meta, ch)
			if err != nil {
				return err
			}
			if won != nil {
				out.applied = append(out.applied, Applied{Table: table, Row: ch.Row, Won: won})
			}
		}
		if len(run.hold) > 0 {
			if out.dropped, err = hold(tx, table, meta, run.hold); err != nil {
				return err
			}
		}
		out.held = getCount(meta, kHeld)
		return meta.Put(run.progress, binary.BigEndian.AppendUint64(nil, run.next))
	})
	return out, err
}

// hold puts changes into table's held bucket within its bound, and
// returns how many it dropped.
func hold(tx *bolt.Tx, table string, meta *bolt.Bucket, changes []Change) (dropped int, err error) {
	tb := tx.Bucket([]byte(table))
	hb, err := tb.CreateBucketIfNotExists(bHeld)
	if err != nil {
		return 0, err
	}
	n, size := getCount(meta, kHeld), getCount(meta, kHeldBytes)
	for _, ch := range changes {
		body, err := json.Marshal(ch)
		if err != nil {
			return dropped, err
		}
		if n+1 > maxHeldChanges || size+len(body) > maxHeldBytes {
			dropped++
			continue
		}
		seq, err := hb.NextSequence()
		if err != nil {
			return dropped, err
		}
		k := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, uint64(maxStamp(ch))), seq)
		if err := hb.Put(k, body); err != nil {
			return dropped, err
		}
		n, size = n+1, size+len(body)
	}
	if err := setCount(meta, kHeld, n); err != nil {
		return dropped, err
	}
	return dropped, setCount(meta, kHeldBytes, size)
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
			var ch Change
			if json.Unmarshal(v, &ch) != nil || ch.Table != table || observe(ch) != nil {
				continue // damaged, or the clock still refuses it: dropped
			}
			won, err := putChange(cells, history, meta, ch)
			if err != nil {
				return err
			}
			if won != nil {
				out = append(out, Applied{Table: table, Row: ch.Row, Won: won})
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
