package rows

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// jsonSamples are batches and changes in the writer's form and in forms
// only encoding/json reads: each must decode as encoding/json decodes it.
var jsonSamples = []string{
	`{"v":1,"kind":"changes","node":"alpha","changes":[{"table":"jobs","row":"42","cells":{"a":{"t":7,"n":"alpha","v":"cXVldWVk"},"b":{"t":8,"n":"alpha","d":true}}}]}`,
	`{"v":1,"kind":"snapshot","node":"beta","snap":"x-beta","part":2,"parts":3,"join":17,"changes":[],"from":12}`,
	`{"v":1,"kind":"changes","node":"alpha","changes":null}`,
	` { "v" : 1 , "kind" : "changes" , "changes" : [ { "table" : "t" , "row" : "r" , "cells" : { } } ] } `,
	`{"v":1,"changes":[{"table":"t","row":"r","cells":{"f":{"t":1,"n":"a","v":""}}}]}`,
	`{"v":1,"changes":[{"table":"t","row":"r","cells":{"f":{"t":1,"n":"a","v":null,"d":false}}}]}`,
	`{"v":1,"changes":[{"table":"t","row":"r","cells":null}]}`,
	// The writer's form, and forms that start as it and then differ.
	`{"v":1,"changes":[{"table":"t","row":"r","cells":{"f":{"t":1,"n":"a","d":true,"v":"eA=="},"g":{"t":2,"n":"a","v":""}}}]}`,
	`{"v":1,"changes":[{"table":"t","row":"r","cells":{"f":{"t":1,"n":"a","d":false}}},{"table":"t","row":"s","cells":{"f":{"t":1,"n":"a","v":"eA==","d":true}}}]}`,
	`{"v":1,"changes":[{"table":"t","row":"r","cells":{"f":{"t":01,"n":"a"}}},{"table":"t","cells":{},"row":"s"}]}`,
	`{"v":1,"changes":[{"table":"t","row":"r","cells":{"f":{"t":1,"n":"a","d":true,"d":true}}}]}`,
	`{"v":1,"changes":[{"table":"t","row":"r","cells":{"f":{"t":1,"n":"a"} },"row":"s"}]}`,
	`{"v":1,"changes":[{}]}`,
	`{}`,
	`null`,
	// Only encoding/json: other spellings of keys, duplicates, escapes,
	// unknown keys, numbers of other forms, wrong types, bad input.
	`{"V":1,"Kind":"changes","changes":[{"TABLE":"t","row":"r","cells":{"f":{"T":1,"n":"a"}}}]}`,
	`{"v":1,"v":2,"node":"a","node":"b"}`,
	`{"v":1,"changes":[{"table":"t","row":"r","cells":{"f":{"t":1,"n":"a"}},"cells":{"g":{"t":2,"n":"b"}}}]}`,
	`{"v":1,"changes":[{"table":"t","row":"r","cells":{"f":{"t":1,"n":"a"},"f":{"t":2,"n":"b","d":true}}}]}`,
	`{"v":1,"changes":[{"table":"t","row":"r","cells":{"g":{"t":1,"n":"a"},"f":{"t":2,"n":"b","d":true}}}]}`,
	`{"v":1,"changes":[{"table":"t","row":"r"}],"changes":[{"cells":{"f":{"t":1,"n":"a"}}}]}`,
	`{"v":1,"node":"\u0061lpha","changes":[{"table":"t","row":"r\"","cells":{"f\n":{"t":1,"n":"é"}}}]}`,
	`{"v":1,"extra":{"a":[1,2,{"b":null}]},"changes":[{"table":"t","row":"r","more":true,"cells":{"f":{"t":1,"n":"a","x":1}}}]}`,
	`{"v":1.0}`, `{"v":1e0}`, `{"v":-1}`, `{"v":01}`, `{"v":99999999999999999999}`,
	`{"join":18446744073709551615}`, `{"join":18446744073709551616}`,
	`{"v":"1"}`, `{"changes":[{"table":"t","row":"r","cells":{"f":{"t":"1","n":"a"}}}]}`,
	`{"changes":[{"table":"t","row":"r","cells":{"f":{"t":1,"n":"a","v":"not base64!"}}}]}`,
	`{"changes":[{"table":"t","row":"r","cells":{"f":{"t":1,"n":"a","v":"YQ"}}}]}`,
	`{"changes":[{"table":"t","row":"r","cells":{"f":{"t":1,"n":"a","d":"yes"}}}]}`,
	`{"v":1}x`, `{"v":1,}`, `{"v":1`, `{"changes":[{"table":"t"},]}`, `[1]`, ``, `{"v":1}{"v":2}`,
	"{\"node\":\"a\x01b\"}", "{\"node\":\"a\xffb\"}", `{"node":"a<b>&"}`,
}

// decodeBoth decodes data as batch and as Change, by the methods and by
// encoding/json alone.
func TestJSONReadsAsEncodingJSON(t *testing.T) {
	for _, s := range jsonSamples {
		checkSameDecode(t, []byte(s))
	}
}

func checkSameDecode(t *testing.T, data []byte) {
	t.Helper()
	var got batch
	var pure pureBatch
	gerr := json.Unmarshal(data, &got)
	werr := json.Unmarshal(data, &pure)
	want := pure.batch()
	if (gerr == nil) != (werr == nil) || gerr == nil && !reflect.DeepEqual(got, want) {
		t.Errorf("batch %q:\ngot  %+v, %v\nwant %+v, %v", data, got, gerr, want, werr)
	}
	var direct batch
	derr := decodeBatch(data, &direct)
	if (derr == nil) != (werr == nil) || derr == nil && !reflect.DeepEqual(direct, want) {
		t.Errorf("decodeBatch %q:\ngot  %+v, %v\nwant %+v, %v", data, direct, derr, want, werr)
	}
	var gc Change
	var wc pureChange
	gerr = json.Unmarshal(data, &gc)
	werr = json.Unmarshal(data, &wc)
	if (gerr == nil) != (werr == nil) || gerr == nil && !reflect.DeepEqual(gc, wc.change()) {
		t.Errorf("change %q:\ngot  %+v, %v\nwant %+v, %v", data, gc, gerr, wc, werr)
	}
}

// pureBatch is batch as encoding/json alone decodes it: batchJSON's
// changes would still be read by Change's method. Its cells are a map,
// as nodes of earlier versions read them.
type pureBatch struct {
	V       int          `json:"v"`
	Kind    string       `json:"kind"`
	Node    string       `json:"node"`
	Snap    string       `json:"snap,omitempty"`
	Part    int          `json:"part,omitempty"`
	Parts   int          `json:"parts,omitempty"`
	Join    uint64       `json:"join,omitempty"`
	Changes []pureChange `json:"changes"`
	From    uint64       `json:"from,omitempty"`
}

// pureChange is Change as encoding/json alone decodes and encodes it,
// its cells a map.
type pureChange struct {
	Table string              `json:"table"`
	Row   string              `json:"row"`
	Cells map[string]WireCell `json:"cells"`
}

func (p pureChange) change() Change {
	return Change{Table: p.Table, Row: p.Row, Cells: CellsOf(p.Cells)}
}

func pureOf(c Change) pureChange { return pureChange{Table: c.Table, Row: c.Row, Cells: c.Cells.Map()} }

func (p pureBatch) batch() batch {
	b := batch{V: p.V, Kind: p.Kind, Node: p.Node, Snap: p.Snap, Part: p.Part, Parts: p.Parts, Join: p.Join, From: p.From}
	if p.Changes != nil {
		b.Changes = []Change{}
	}
	for _, c := range p.Changes {
		b.Changes = append(b.Changes, c.change())
	}
	return b
}

// A batch of many changes of several cells each reads as encoding/json
// reads it: the reader's chunks of cells fill and start anew mid-change.
func TestJSONReadsManyCells(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"v":1,"kind":"snapshot","node":"a","changes":[`)
	for i := range 700 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"table":"t","row":"r%d","cells":{`, i)
		for f := range 1 + i%9 {
			if f > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"f%d":{"t":%d,"n":"n%d","v":"dmFsdWU="}`, f, i, f%3)
		}
		b.WriteString(`}}`)
	}
	b.WriteString(`]}`)
	checkSameDecode(t, []byte(b.String()))
	var got batch
	if err := decodeBatch([]byte(b.String()), &got); err != nil || len(got.Changes) != 700 || len(got.Changes[699].Cells) != 7 {
		t.Fatalf("decodeBatch: %v, %d changes", err, len(got.Changes))
	}
}

// The writer makes encoding/json's bytes.
func TestJSONWritesAsEncodingJSON(t *testing.T) {
	for _, c := range []Change{
		{Table: "jobs", Row: "42", Cells: CellsOf(map[string]WireCell{"status": {Stamp: 1 << 50, Node: "alpha", Value: []byte("queued")}, "a": {Stamp: 3, Node: "b", Deleted: true}})},
		{Table: "jobs", Row: "42", Cells: CellsOf(map[string]WireCell{"e": {Stamp: 0, Node: "", Value: []byte{}}})},
		{Table: "t", Row: "r"},
		{Table: "t", Row: "r", Cells: CellsOf(map[string]WireCell{})},
		{Table: "a<b>&\"\\\n\r\t\x01\x7f", Row: "é\u2028\u2029\xff\xfe", Cells: CellsOf(map[string]WireCell{"\x00": {Node: "</script>", Value: []byte{0, 255}}})},
	} {
		want, err := json.Marshal(pureOf(c))
		if err != nil {
			t.Fatal(err)
		}
		if got := appendChange(nil, &c); string(got) != string(want) {
			t.Errorf("appendChange:\ngot  %s\nwant %s", got, want)
		}
		if got, _ := json.Marshal(c); string(got) != string(want) {
			t.Errorf("json.Marshal:\ngot  %s\nwant %s", got, want)
		}
		var back Change
		if err := json.Unmarshal(want, &back); err != nil {
			t.Fatal(err)
		}
		var wantBack pureChange
		_ = json.Unmarshal(want, &wantBack)
		if !reflect.DeepEqual(back, wantBack.change()) {
			t.Errorf("read back %q: got %+v, want %+v", want, back, wantBack)
		}
	}
}

// The writer makes encoding/json's bytes of a batch too (the publisher
// splices changes into the head of an empty one).
func TestJSONWritesBatchAsEncodingJSON(t *testing.T) {
	c := Change{Table: "jobs", Row: "42", Cells: CellsOf(map[string]WireCell{"status": {Stamp: 7, Node: "alpha", Value: []byte("queued")}})}
	for _, b := range []batch{
		{V: 1, Kind: kindChanges, Node: "alpha"},
		{V: 1, Kind: kindChanges, Node: "alpha", Join: 9, Changes: []Change{c, c}},
		{V: 1, Kind: kindSnapshot, Node: "b<e>ta", Snap: "x-beta", Part: 2, Parts: 3, Join: 17, From: 12, Changes: []Change{}},
		{V: -1, Part: -2, Parts: -3},
	} {
		pure := pureBatch{V: b.V, Kind: b.Kind, Node: b.Node, Snap: b.Snap, Part: b.Part, Parts: b.Parts, Join: b.Join, From: b.From}
		if b.Changes != nil {
			pure.Changes = []pureChange{}
		}
		for _, c := range b.Changes {
			pure.Changes = append(pure.Changes, pureOf(c))
		}
		want, err := json.Marshal(pure)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := json.Marshal(b); string(got) != string(want) {
			t.Errorf("json.Marshal:\ngot  %s\nwant %s", got, want)
		}
	}
}

func FuzzJSONReadsAsEncodingJSON(f *testing.F) {
	for _, s := range jsonSamples {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<12 || strings.Count(string(data), "[") > 64 {
			return
		}
		checkSameDecode(t, data)
	})
}

// The reader knows every key of the types it reads: a field added to
// batch, Change or WireCell without its key here would send every
// message to encoding/json.
func TestJSONKeysComplete(t *testing.T) {
	for _, tt := range []struct {
		v    any
		keys []string
	}{{batch{}, batchKeys}, {pureBatch{}, batchKeys}, {Change{}, changeKeys}, {WireCell{}, cellKeys}} {
		typ := reflect.TypeOf(tt.v)
		var tags []string
		for i := range typ.NumField() {
			if !typ.Field(i).IsExported() {
				continue // encoding/json leaves it alone too
			}
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			tags = append(tags, name)
		}
		if !reflect.DeepEqual(tags, tt.keys) {
			t.Errorf("%s: keys %v, the reader knows %v", typ, tags, tt.keys)
		}
	}
}

// plainASCII, eight bytes at a time, says what a byte at a time says:
// every byte value at every place of strings of 1 to 24 bytes.
func TestPlainASCII(t *testing.T) {
	for n := 1; n <= 24; n++ {
		for at := range n {
			for c := range 256 {
				s := []byte(strings.Repeat("a", n))
				s[at] = byte(c)
				want := c >= 0x20 && c < 0x7f && c != '\\'
				if got := plainASCII(s); got != want {
					t.Fatalf("plainASCII(%q): got %v, want %v", s, got, want)
				}
			}
		}
	}
}
