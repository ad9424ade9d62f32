package rows

import (
	"bytes"
	"encoding/binary"

	bolt "go.etcd.io/bbolt"
)

// Attesting a snapshot's versions. A snapshot carries every writer's
// versions, and its sender could name any writer: a joiner applies it,
// then checks it (verify.go). Each version the snapshot gave it that
// names another writer than the snapshot's sender is recorded as
// unattested; the verifier, reading the log before the snapshot, strikes
// off each one a change of its named writer made. What is left when the
// verifier is done, on a log read from its first offset, no change made:
// where the joiner still holds it, it is undone (the field goes back to
// the newest version the log made, or is removed) and counted as
// snapshot_disagrees. Where the log no longer starts at its beginning
// (retention), what is left may be older than the log and stays, counted
// in the table's status (unattested).

var (
	bUnattested = []byte("unattested")
	bAttested   = []byte("attested")
)

// attestKey is the key of a version: row \x00 field \x00 stamp node.
func attestKey(row, field string, stamp Stamp, node string) []byte {
	k := cellKey(row, field)
	k = append(k, 0)
	k = binary.BigEndian.AppendUint64(k, uint64(stamp))
	return append(k, node...)
}

// snapshotClaims returns the keys of the versions of changes, a
// snapshot's part from origin, that name another writer.
func snapshotClaims(changes []Change, origin string) [][]byte {
	var out [][]byte
	for _, ch := range changes {
		for _, c := range ch.Cells {
			if c.Node != origin {
				out = append(out, attestKey(ch.Row, c.Field, c.Stamp, c.Node))
			}
		}
	}
	return out
}

// claim records unattested versions, but those a change of the log made
// already (the reader may read a change after the snapshot's start
// before the snapshot's parts); attest strikes versions off, or records
// them for a claim still to come (tx of applyLog).
func claim(tx *bolt.Tx, table string, keys [][]byte) error {
	tb := tx.Bucket([]byte(table))
	claims, err := tb.CreateBucketIfNotExists(bUnattested)
	if err != nil {
		return err
	}
	seen := tb.Bucket(bAttested)
	for _, k := range keys {
		if seen != nil && seen.Get(k) != nil {
			continue
		}
		if err := claims.Put(k, nil); err != nil {
			return err
		}
	}
	return nil
}

// attest strikes the versions of changes (of change batches: their
// writer is the batch's validated sender) off the claims; with record,
// it records the others for claims still to come. Without record and
// without claims, there is nothing to do: a joiner whose snapshot's
// sender wrote every version it holds pays nothing for the check.
func attest(tx *bolt.Tx, table string, changes []Change, record bool) error {
	tb := tx.Bucket([]byte(table))
	claims := tb.Bucket(bUnattested)
	if claims != nil {
		if k, _ := claims.Cursor().First(); k == nil {
			claims = nil
		}
	}
	if claims == nil && !record {
		return nil
	}
	var seen *bolt.Bucket
	if record {
		var err error
		if seen, err = tb.CreateBucketIfNotExists(bAttested); err != nil {
			return err
		}
	}
	for _, ch := range changes {
		for _, c := range ch.Cells {
			k := attestKey(ch.Row, c.Field, c.Stamp, c.Node)
			if claims != nil && claims.Get(k) != nil {
				if err := claims.Delete(k); err != nil {
					return err
				}
				continue
			}
			if record {
				if err := seen.Put(k, nil); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// settleClaims ends the check of a snapshot: with complete (the log was
// read from its first offset), every version still unattested that the
// store holds as a field's winner is undone; otherwise they are counted.
// The record is dropped either way.
func (s *Store) settleClaims(table string, complete bool) (undone, left int, err error) {
	err = s.update(func(tx *bolt.Tx) error {
		undone, left = 0, 0
		if sub(tx, table, bAttested) != nil {
			if err := tx.Bucket([]byte(table)).DeleteBucket(bAttested); err != nil {
				return err
			}
		}
		ub := sub(tx, table, bUnattested)
		if ub == nil {
			return nil
		}
		cells, history, _, meta, err := tableBuckets(tx, table)
		if err != nil {
			return err
		}
		cur := ub.Cursor()
		for k, _ := cur.First(); k != nil; k, _ = cur.Next() {
			i1 := bytes.IndexByte(k, 0)
			if i1 < 0 {
				continue
			}
			i := bytes.IndexByte(k[i1+1:], 0)
			if i < 0 || len(k) < i1+1+i+9 {
				continue
			}
			i += i1 + 1
			row, field := string(k[:i1]), string(k[i1+1:i])
			stamp, node := Stamp(binary.BigEndian.Uint64(k[i+1:i+9])), string(k[i+9:])
			if row == "" {
				continue
			}
			held, err := rowCell(cells.Get([]byte(row)), field)
			if err != nil || held == nil {
				continue
			}
			c, err := decodeCell(held)
			if err != nil || c.Stamp != stamp || c.Node != node {
				continue // a newer version won since: nothing to undo
			}
			if !complete {
				left++
				continue
			}
			before := rowLive(cells, row)
			if err := revertCell(cells, history, row, field, stamp); err != nil {
				return err
			}
			if after := rowLive(cells, row); after != before {
				d := 1
				if before {
					d = -1
				}
				if err := addCount(meta, kRows, d); err != nil {
					return err
				}
			}
			undone++
		}
		return tx.Bucket([]byte(table)).DeleteBucket(bUnattested)
	})
	return undone, left, err
}

// revertCell replaces the winner of row's field (stamped stamp) with the
// newest version of the field's history older than it, or removes the
// field (and the row, when it was its last).
func revertCell(cells, history *bolt.Bucket, row, field string, stamp Stamp) error {
	prefix := append(cellKey(row, field), 0)
	cur := history.Cursor()
	var best []byte
	for hk, v := cur.Seek(prefix); hk != nil && bytes.HasPrefix(hk, prefix); hk, v = cur.Next() {
		if len(hk) == len(prefix)+8 && Stamp(binary.BigEndian.Uint64(hk[len(prefix):])) < stamp {
			best = v // ascending: the last one is the newest
		}
	}
	old := cells.Get([]byte(row))
	var v []byte
	err := rowEntries(old, func(f, enc []byte) bool {
		switch {
		case string(f) != field:
			v = appendEntry(v, string(f), enc)
		case best != nil:
			v = appendEntry(v, field, best)
		}
		return true
	})
	switch {
	case err != nil:
		return err
	case len(v) == 0:
		return cells.Delete([]byte(row))
	}
	return cells.Put([]byte(row), v)
}
