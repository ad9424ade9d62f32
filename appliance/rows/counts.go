package rows

import (
	"encoding/binary"

	bolt "go.etcd.io/bbolt"
)

// The counts a table's meta bucket keeps (rows, pending), changed in the
// transaction of every change, so that status reads them, not the table.

// countAll counts the rows and pending writes of every table whose meta
// lacks them (a store written before the counts were kept).
func countAll(tx *bolt.Tx) error {
	return tx.ForEach(func(name []byte, tb *bolt.Bucket) error {
		meta := tb.Bucket(bMeta)
		if meta != nil && meta.Get(kRows) != nil {
			return nil
		}
		meta, err := tb.CreateBucketIfNotExists(bMeta)
		if err != nil {
			return err
		}
		rows, pending := 0, 0
		if p := tb.Bucket(bPending); p != nil {
			pending = p.Stats().KeyN
		}
		if cells := tb.Bucket(bCells); cells != nil {
			cur := cells.Cursor()
			for k, v := cur.First(); k != nil; k, v = cur.Next() {
				if valueLive(v) {
					rows++
				}
			}
		}
		if err := setCount(meta, kRows, rows); err != nil {
			return err
		}
		return setCount(meta, kPending, pending)
	})
}

func getCount(meta *bolt.Bucket, k []byte) int {
	if v := meta.Get(k); len(v) == 8 {
		return int(binary.BigEndian.Uint64(v))
	}
	return 0
}

func setCount(meta *bolt.Bucket, k []byte, n int) error {
	return meta.Put(k, binary.BigEndian.AppendUint64(nil, uint64(max(n, 0))))
}

func addCount(meta *bolt.Bucket, k []byte, d int) error {
	if d == 0 {
		return nil
	}
	return setCount(meta, k, getCount(meta, k)+d)
}

// rowLive reports whether row has a field not deleted.
func rowLive(cells *bolt.Bucket, row string) bool {
	return row != "" && valueLive(cells.Get([]byte(row)))
}

// Counts returns table's rows (with at least one field not deleted),
// and its pending writes, as the store keeps them with every change.
func (s *Store) Counts(table string) (rows, pending int, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		if meta := sub(tx, table, bMeta); meta != nil {
			rows, pending = getCount(meta, kRows), getCount(meta, kPending)
		}
		return nil
	})
	return rows, pending, err
}
