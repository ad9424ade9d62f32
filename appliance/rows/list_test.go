package rows_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// TestListPages: a list that says More goes on from its last row with
// After, page after page, until every row was seen once and in key
// order, prefix or not; rows whose keys extend another's (a, a-b, a.b,
// ab) are neither skipped nor repeated, nor is a deleted row shown.
func TestListPages(t *testing.T) {
	e, err := rows.Open(rows.Config{Node: "solo", Path: filepath.Join(t.TempDir(), "rows.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.SetTables(map[string]rows.TableSpec{"jobs": {}})
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	if _, err := e.Serve(rows.ServeConfig{Conn: nc}); err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "a-b", "a.b", "a.b.c", "a0", "ab", "b", "gone", "z"}
	for i := range 20 {
		keys = append(keys, fmt.Sprintf("t%02d", i))
	}
	for _, k := range keys {
		if _, err := e.Put("jobs", k, map[string][]byte{"k": []byte(k), "status": []byte("queued")}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.DeleteRow("jobs", "gone"); err != nil {
		t.Fatal(err)
	}
	live := slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return k == "gone" })
	slices.Sort(live)

	list := func(req rows.Request) (rows.ListDoc, int) {
		t.Helper()
		body, _ := json.Marshal(req)
		m, err := nc.Request(rows.Subject("jobs", rows.OpList), body, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if code, _ := natstest.ServiceError(m); code != 0 {
			return rows.ListDoc{}, code
		}
		var doc rows.ListDoc
		if err := json.Unmarshal(m.Data, &doc); err != nil {
			t.Fatal(err)
		}
		return doc, 0
	}
	pages := func(prefix string, limit int) (seen []string, n int) {
		after := ""
		for {
			doc, code := list(rows.Request{Prefix: prefix, Limit: limit, After: after})
			if code != 0 {
				t.Fatalf("list prefix %q after %q: error %d", prefix, after, code)
			}
			n++
			for _, r := range doc.Rows {
				if r.Fields["k"] != r.Row {
					t.Errorf("row %s holds %v", r.Row, r.Fields)
				}
				seen = append(seen, r.Row)
			}
			if !doc.More {
				return seen, n
			}
			if len(doc.Rows) == 0 || n > 100 {
				t.Fatalf("list prefix %q after %q: More with no progress", prefix, after)
			}
			after = doc.Rows[len(doc.Rows)-1].Row
		}
	}
	for _, limit := range []int{1, 2, 3, 7, 28, 100} {
		seen, n := pages("", limit)
		if !slices.Equal(seen, live) {
			t.Errorf("limit %d: pages gave %v, want %v", limit, seen, live)
		}
		if want := (len(live) + limit - 1) / limit; n < want || n > want+1 {
			t.Errorf("limit %d: %d pages, want %d or %d", limit, n, want, want+1)
		}
	}
	if seen, _ := pages("a", 2); !slices.Equal(seen, []string{"a", "a-b", "a.b", "a.b.c", "a0", "ab"}) {
		t.Errorf("prefix a by twos: %v", seen)
	}
	if seen, _ := pages("t1", 4); !slices.Equal(seen, []string{"t10", "t11", "t12", "t13", "t14", "t15", "t16", "t17", "t18", "t19"}) {
		t.Errorf("prefix t1 by fours: %v", seen)
	}
	// After a key that holds no row, or before the prefix, or past it.
	if doc, _ := list(rows.Request{After: "a.b.b", Limit: 2}); len(doc.Rows) != 2 || doc.Rows[0].Row != "a.b.c" || doc.Rows[1].Row != "a0" || !doc.More {
		t.Errorf("after a.b.b: %+v, want a.b.c, a0 and more", doc)
	}
	if doc, _ := list(rows.Request{Prefix: "t", After: "b"}); len(doc.Rows) != 20 || doc.Rows[0].Row != "t00" {
		t.Errorf("prefix t after b: %d rows, want the 20 of t", len(doc.Rows))
	}
	if doc, _ := list(rows.Request{Prefix: "a", After: "b"}); len(doc.Rows) != 0 || doc.More {
		t.Errorf("prefix a after b: %+v, want none", doc)
	}
	if doc, _ := list(rows.Request{After: "z"}); len(doc.Rows) != 0 || doc.More {
		t.Errorf("after the last row: %+v, want none", doc)
	}
	if _, code := list(rows.Request{After: ".x"}); code != 400 {
		t.Errorf("after .x (no row key): code %d, want 400", code)
	}
}

// A table's stream queue never gets a bound of 0 (a stream of 0 bytes
// takes no message and confirms none): 0 means the default.
func TestStreamArgsDefaults(t *testing.T) {
	a := rows.StreamArgs(0, 0)
	if a["x-max-length-bytes"] != int64(rows.DefaultMaxBytes) || a["x-max-age"] != fmt.Sprintf("%ds", int64(rows.DefaultMaxAge/time.Second)) {
		t.Fatalf("StreamArgs(0, 0) = %v; want the defaults", a)
	}
	if seg := a["x-stream-max-segment-size-bytes"].(int64); seg <= 0 {
		t.Fatalf("segment size %d", seg)
	}
	b := rows.StreamArgs(time.Hour, 4<<20)
	if b["x-max-length-bytes"] != int64(4<<20) || b["x-max-age"] != "3600s" || b["x-stream-max-segment-size-bytes"] != int64(1<<20) {
		t.Fatalf("StreamArgs(1h, 4 MiB) = %v", b)
	}
}
