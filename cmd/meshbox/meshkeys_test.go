package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/testing/meshtest"
)

func TestMeshKeyRotateAndList(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	c := cli{env: map[string]string{"MESHBOX_DB": meshtest.Postgres(t).Database(t)}}
	c.ok(t, "init", "--node", "n1", "--broker", "amqp://127.0.0.1:5672/")
	if out := c.ok(t, "mesh", "key", "list"); !strings.Contains(out, "k1") || !strings.Contains(out, "nobody yet") {
		t.Fatalf("key list after init, want k1 held by nobody yet:\n%s", out)
	}
	c.fails(t, "shorter than a minute", "mesh", "key", "rotate", "--retention", "1s")
	out := c.ok(t, "mesh", "key", "rotate", "--retention", "2h")
	if !strings.Contains(out, "retire in 2h0m0s") {
		t.Fatalf("key rotate:\n%s", out)
	}
	var keys []struct {
		ID       string     `json:"id"`
		RetireAt *time.Time `json:"retire_at"`
	}
	if err := json.Unmarshal([]byte(c.ok(t, "mesh", "key", "list", "--json")), &keys); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0].ID != "k1" || keys[0].RetireAt == nil || time.Until(*keys[0].RetireAt) < time.Hour ||
		keys[1].RetireAt != nil || !strings.Contains(out, keys[1].ID) {
		t.Fatalf("keys after rotation: %+v, want k1 retiring in 2h and the new one", keys)
	}
}
