package rows

import (
	"fmt"
)

// Writes of many rows at once: a program that writes many rows sends
// them in one request (the API's putmany, the CLI's rows put --from),
// and the node commits them all or none in one transaction. A put of
// one row is the batch of one.

// MaxPutMany is the most rows one batch put writes.
const MaxPutMany = 1000

// RowWrite is one row's part of a batch put: fields set and deleted, as
// Put takes them.
type RowWrite struct {
	Row    string
	Set    map[string][]byte
	Delete []string
}

// PutMany writes the rows of table in writes, each checked as Put checks
// it, and returns their stamps (in the order of writes) once all are
// committed on this node's disk, in one transaction: a write refused
// refuses the batch, and nothing of it is written. A row may come more
// than once; the later write has the later stamp.
func (e *Engine) PutMany(table string, writes []RowWrite) ([]Stamp, error) {
	sp, err := e.spec(table)
	if err != nil {
		return nil, err
	}
	switch n := len(writes); {
	case n == 0:
		return nil, fmt.Errorf("%w: a batch put writes at least one row", ErrBadInput)
	case n > MaxPutMany:
		return nil, fmt.Errorf("%w: %d rows in one batch put, at most %d", ErrBadInput, n, MaxPutMany)
	}
	for i, w := range writes {
		if err := CheckWrite(w.Row, w.Set, w.Delete); err != nil {
			if len(writes) == 1 {
				return nil, err
			}
			return nil, fmt.Errorf("write %d of %d (row %q): %w", i+1, len(writes), w.Row, err)
		}
	}
	if e.cfg.Keys != nil { // a mesh seals every table
		if _, err := e.cfg.Keys.SealerFor(sp.Scope); err != nil {
			return nil, fmt.Errorf("%w: this node holds no key of %s, which seals table %s: %v", ErrNoKey, scopeName(sp.Scope), table, err)
		}
	}
	stamps := make([]Stamp, len(writes))
	changes := make([]Change, len(writes))
	for i, w := range writes {
		stamp := e.clock.Next()
		ch := Change{Table: table, Row: w.Row, Cells: make(Cells, 0, len(w.Set)+len(w.Delete))}
		for f, v := range w.Set {
			ch.Cells = append(ch.Cells, FieldCell{f, WireCell{Stamp: stamp, Node: e.cfg.Node, Value: v}})
		}
		for _, f := range w.Delete {
			ch.Cells = append(ch.Cells, FieldCell{f, WireCell{Stamp: stamp, Node: e.cfg.Node, Deleted: true}})
		}
		ch.Cells = sortCells(ch.Cells)
		stamps[i], changes[i] = stamp, ch
	}
	if err := e.store.WriteMany(changes); err != nil {
		e.m.errors.WithLabelValues("store").Inc()
		return nil, fmt.Errorf("store the write: %w", err)
	}
	e.m.writes.Add(float64(len(changes)))
	signal(e.wake)
	for _, ch := range changes {
		e.notify(appliedAll(ch))
	}
	return stamps, nil
}
