package rows

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/internal/seal"
)

// binTestRing is a keyring of one content key, and its sealer.
func binTestRing(t testing.TB) (*seal.Keyring, *seal.Sealer) {
	t.Helper()
	k := seal.NewContentKey()
	ring, err := seal.NewKeyring([]seal.ContentKey{k}, k.ID)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ring.Sealer()
	if err != nil {
		t.Fatal(err)
	}
	return ring, s
}

// binTestPart is a snapshot's part with what a part can hold: fields
// in order, a tombstone, an empty value, writers other than the sender,
// a value of the largest size.
func binTestPart() batch {
	return batch{V: snapshotV, Kind: kindSnapshot, Node: "alpha", Snap: "s1-alpha", Part: 2, Parts: 3, Join: 7, From: 40,
		Changes: []Change{
			{Table: "jobs", Row: "job-1", Cells: CellsOf(map[string]WireCell{
				"owner":  {Stamp: 1 << 48, Node: "alpha", Value: []byte("alpha")},
				"status": {Stamp: 1<<48 + 1, Node: "beta", Value: []byte("done")},
			})},
			{Table: "jobs", Row: "job-2", Cells: CellsOf(map[string]WireCell{
				"status": {Stamp: 5, Node: "gamma", Deleted: true},
			})},
			{Table: "jobs", Row: "job-3", Cells: CellsOf(map[string]WireCell{
				"blob": {Stamp: 9, Node: "alpha", Value: bytes.Repeat([]byte{0, 0xff}, MaxValueLen/2)},
				"note": {Stamp: 9, Node: "alpha"},
			})},
		}}
}

// A part written in binary opens to the batch that was written, by the
// checks a part in JSON takes; it is about half the size of the same
// part in JSON.
func TestBinaryPartRoundTrip(t *testing.T) {
	ring, s := binTestRing(t)
	in := binTestPart()
	body, err := sealBatch(s, "jobs", &in)
	if err != nil {
		t.Fatal(err)
	}
	got, err := openBatch(nil, ring, "jobs", s.ID(), body)
	if err != nil {
		t.Fatal(err)
	}
	checkStored(t, got, true)
	if !reflect.DeepEqual(*got, in) {
		t.Fatalf("opened\n%+v\nwritten\n%+v", *got, in)
	}
	// In place, as the reader opens: the same.
	again, err := openBatch(body[:0], ring, "jobs", s.ID(), bytes.Clone(body))
	if err != nil {
		t.Fatal(err)
	}
	checkStored(t, again, true)
	if !reflect.DeepEqual(*again, in) {
		t.Fatalf("opened in place: %v\n%+v", err, again)
	}
	asJSON := in
	asJSON.V = 1
	jbody, err := sealBatch(s, "jobs", &asJSON)
	if err != nil {
		t.Fatal(err)
	}
	if len(body) >= len(jbody) {
		t.Fatalf("binary part %d bytes, the JSON one %d", len(body), len(jbody))
	}
	// Parts of version 1 (JSON, written by nodes of before) open as ever.
	old, err := openBatch(nil, ring, "jobs", s.ID(), jbody)
	if err != nil || old.V != 1 || len(old.Changes) != 3 {
		t.Fatalf("a part in JSON: %v %+v", err, old)
	}
}

// A member's part is its word: one that breaks a rule of the store's
// rows (fields out of order or twice, names the rules refuse, an
// unknown flag, a value over the bound, a tombstone with a value, a
// change of another table,
// lengths past the end) does not open, and nothing of it is applied.
// The control: the honest part opens (TestBinaryPartRoundTrip).
func TestBinaryPartRefused(t *testing.T) {
	ring, s := binTestRing(t)
	sealPT := func(pt []byte) []byte { return s.Seal(nil, sealAD("jobs", s.ID()), pt) }
	good := binTestPart()
	pt := appendBinaryPart(nil, &good)
	head := func(b batch) []byte {
		b.Changes = nil
		h := appendBatch(nil, &b)
		out := binary.AppendUvarint([]byte{binaryPart}, uint64(len(h)))
		return append(out, h...)
	}
	row := func(name string, entries ...[]byte) []byte {
		out := binary.AppendUvarint(nil, uint64(len(name)))
		out = append(out, name...)
		v := bytes.Join(entries, nil)
		out = binary.AppendUvarint(out, uint64(len(v)))
		return append(out, v...)
	}
	cell := func(field string, c Cell) []byte { return appendCellEntry(nil, field, c) }
	ok := Cell{Stamp: 1, Node: "alpha", Value: []byte("x")}
	flagged := cell("status", ok)
	flagged[1+len("status")+1+8] = 4 // the flags byte
	for _, tt := range []struct {
		name string
		pt   []byte
	}{
		{"fields out of order", append(head(good), row("job-1", cell("status", ok), cell("owner", ok))...)},
		{"a field twice", append(head(good), row("job-1", cell("status", ok), cell("status", ok))...)},
		{"a field name refused", append(head(good), row("job-1", cell("bad field", ok))...)},
		{"a row name refused", append(head(good), row("", cell("status", ok))...)},
		{"a writer's name not UTF-8", append(head(good), row("job-1", cell("status", Cell{Stamp: 1, Node: "\xff\x00x", Value: []byte("x")}))...)},
		{"no writer", append(head(good), row("job-1", cell("status", Cell{Stamp: 1, Value: []byte("x")}))...)},
		{"an unknown flag", append(head(good), row("job-1", flagged)...)},
		{"a value over the bound", append(head(good), row("job-1", cell("status", Cell{Stamp: 1, Node: "a", Value: make([]byte, MaxValueLen+1)}))...)},
		{"a tombstone with a value", append(head(good), row("job-1", cell("status", Cell{Stamp: 1, Node: "a", Deleted: true, Value: make([]byte, MaxValueLen)}))...)},
		{"a row without cells", append(head(good), row("job-1")...)},
		{"truncated", pt[:len(pt)-3]},
		{"a length past the end", append(head(good), 0xff, 0xff, 0xff, 0x7f)},
		{"changes in its head", append(binary.AppendUvarint([]byte{binaryPart}, uint64(len(appendBatch(nil, &good)))), appendBatch(nil, &good)...)},
		{"version 1 in binary", func() []byte { b := good; b.V = 1; return head(b) }()},
		{"a batch of changes in binary", func() []byte { b := good; b.Kind = kindChanges; return head(b) }()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if b, err := openBatch(nil, ring, "jobs", s.ID(), sealPT(tt.pt)); !errors.Is(err, errUnopened) {
				t.Fatalf("opened (%v): %+v", err, b)
			}
		})
	}
	// JSON claiming version 2 is refused as well.
	j := good
	if _, err := openBatch(nil, ring, "jobs", s.ID(), sealPT(appendBatch(nil, &j))); !errors.Is(err, errUnopened) {
		t.Fatalf("JSON of version 2 opened: %v", err)
	}
	// Sealed for another table, the part does not open there.
	// The same rule for a change in JSON: a tombstone with a value (the
	// control, one without, opens in TestChangesBatchOpens).
	tomb := batch{V: 1, Kind: kindChanges, Node: "alpha", Changes: []Change{{Table: "jobs", Row: "job-1",
		Cells: CellsOf(map[string]WireCell{"status": {Stamp: 1, Node: "alpha", Deleted: true, Value: []byte("pad")}})}}}
	if _, err := openBatch(nil, ring, "jobs", s.ID(), sealPT(appendBatch(nil, &tomb))); !errors.Is(err, errUnopened) {
		t.Fatalf("a change in JSON deleting a field with a value opened: %v", err)
	}
	if _, err := openBatch(nil, ring, "other", s.ID(), sealPT(pt)); !errors.Is(err, errUnopened) {
		t.Fatalf("a part of jobs opened in the log of other: %v", err)
	}
}

// Any bytes: the decoder never panics, and what it decodes, written
// again, decodes the same.
func FuzzBinaryPart(f *testing.F) {
	good := binTestPart()
	f.Add(appendBinaryPart(nil, &good))
	f.Add([]byte{binaryPart})
	f.Add([]byte{binaryPart, 2, '{', '}'})
	f.Add(append([]byte{binaryPart}, strings.Repeat("\xff", 12)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		var b batch
		if err := decodeBinaryPart(data, "jobs", &b); err != nil {
			return
		}
		var again batch
		if err := decodeBinaryPart(appendBinaryPart(nil, &b), "jobs", &again); err != nil {
			t.Fatalf("written again, it does not decode: %v", err)
		}
		checkStored(t, &b, false)
		checkStored(t, &again, true)
		if !reflect.DeepEqual(b, again) {
			t.Fatalf("decoded\n%+v\nwritten and decoded again\n%+v", b, again)
		}
	})
}

// checkStored checks that each change's stored value, where decoding
// set it (all: on every change), is the one preEncode makes of its
// cells, and clears it.
func checkStored(t *testing.T, b *batch, all bool) {
	t.Helper()
	for i := range b.Changes {
		ch := &b.Changes[i]
		if ch.stored == nil {
			if all {
				t.Fatalf("row %s decoded without its stored value", ch.Row)
			}
			continue
		}
		want := []Change{{Cells: ch.Cells}}
		preEncode(want)
		if !bytes.Equal(ch.stored, want[0].stored) {
			t.Fatalf("row %s: stored value %x, its cells make %x", ch.Row, ch.stored, want[0].stored)
		}
		ch.stored = nil
	}
}

// A row's cells in a binary part are its stored value as they are,
// unless a length in them is written longer than it need be (a varint
// with a needless byte): such a row's cells decode the same, and its
// stored value is made anew, so the store never keeps the long form.
func TestBinaryPartStoredAsIs(t *testing.T) {
	in := binTestPart()
	in.Changes = in.Changes[:2]
	long := func(dst []byte, n int) []byte { // n's varint with a needless last byte
		v := binary.AppendUvarint(nil, uint64(n))
		v[len(v)-1] |= 0x80
		return append(append(dst, v...), 0)
	}
	head := in
	head.Changes = nil
	h := appendBatch(nil, &head)
	part := binary.AppendUvarint([]byte{binaryPart}, uint64(len(h)))
	part = append(part, h...)
	for i, ch := range in.Changes {
		var cells []byte
		for _, c := range ch.Cells {
			enc := c.cell().encode(nil)
			cells = append(append(cells, byte(len(c.Field))), c.Field...)
			if i == 1 {
				cells = long(cells, len(enc))
			} else {
				cells = binary.AppendUvarint(cells, uint64(len(enc)))
			}
			cells = append(cells, enc...)
		}
		part = append(binary.AppendUvarint(part, uint64(len(ch.Row))), ch.Row...)
		part = append(binary.AppendUvarint(part, uint64(len(cells))), cells...)
	}
	var b batch
	if err := decodeBinaryPart(part, "jobs", &b); err != nil {
		t.Fatal(err)
	}
	if b.Changes[0].stored == nil || b.Changes[1].stored != nil {
		t.Fatalf("stored as is: row 1 %v (want yes), row 2 %v (want no: a long length)", b.Changes[0].stored != nil, b.Changes[1].stored != nil)
	}
	preEncode(b.Changes)
	checkStored(t, &b, true)
	if !reflect.DeepEqual(b, in) {
		t.Fatalf("decoded\n%+v\nwritten\n%+v", b, in)
	}
}
