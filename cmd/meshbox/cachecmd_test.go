package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/cache"
)

// TestCacheShowPrintsNoSecret puts passwords everywhere a snapshot can
// hold one and checks that cache show (text and JSON) and cache diff
// print none of them, and that --reveal does.
func TestCacheShowPrintsNoSecret(t *testing.T) {
	data := t.TempDir()
	store, err := cache.Open(filepath.Join(data, "cache.db"), cache.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secrets := []string{"GRANTPW", "BROKERPW", "SETTINGURLPW", "SETTINGKEYPW", "OVERRIDEPW", "OVERRIDEURLPW", "QUERYTOKEN", "IDENTITYPW", "SOURCEPW", "DBROLEPW"}
	b := cache.Bindings{
		Node:  "n1",
		Nodes: []cache.NodeRecord{{Name: "n1", Identity: "backup at sftp://me:IDENTITYPW@nas/x"}},
		Settings: map[string]string{
			"broker.url":    "amqps://broker.example.org/mesh",
			"forge.url":     "https://ci:SETTINGURLPW@forge.example.org/?access_token=QUERYTOKEN",
			"smtp.password": "SETTINGKEYPW",
		},
		Overrides: []cache.Override{
			{Module: "photos", Key: "db_password", Value: "OVERRIDEPW"},
			{Module: "photos", Key: "upstream", Value: "postgres://u:OVERRIDEURLPW@h/db"},
			{Module: "photos", Key: "threads", Value: "4"},
		},
		Grants: []cache.Grant{{Consumer: "n1", Resource: "bucket", Provider: "n2", Credential: "GRANTPW"}},
		Broker: &cache.BrokerCredential{Generation: 2, User: "node.n1.g2", Password: "BROKERPW", CreatedAt: time.Now(),
			DBRole: "meshbox_node_n1_g2", DBPassword: "DBROLEPW"},
	}
	if err := store.Put(cache.NewSnapshot(1, time.Now(), "postgres://admin:SOURCEPW@db/mesh", b)); err != nil {
		t.Fatal(err)
	}
	b.Overrides[2].Value = "8"
	b.Settings["smtp.password"] = "SETTINGKEYPW2"
	if err := store.Put(cache.NewSnapshot(2, time.Now(), "postgres://admin:SOURCEPW@db/mesh", b)); err != nil {
		t.Fatal(err)
	}
	store.Close()
	secrets = append(secrets, "SETTINGKEYPW2")

	c := cli{env: map[string]string{"MESHBOX_DATA": data}}
	for _, args := range [][]string{
		{"cache", "show"}, {"cache", "show", "--json"}, {"cache", "show", "--revision", "1", "--json"},
		{"cache", "diff", "1", "2"}, {"cache", "diff", "1", "2", "--json"}, {"cache", "history", "--json"},
	} {
		out := c.ok(t, args...)
		for _, s := range secrets {
			if strings.Contains(out, s) {
				t.Errorf("meshbox %s prints %s:\n%s", strings.Join(args, " "), s, out)
			}
		}
	}
	// Not a secret: still shown.
	out := c.ok(t, "cache", "show", "--json")
	var snap cache.Snapshot
	if err := json.Unmarshal([]byte(out), &snap); err != nil {
		t.Fatal(err)
	}
	if snap.Bindings.Settings["broker.url"] != "amqps://broker.example.org/mesh" || snap.Bindings.Broker.User != "node.n1.g2" || snap.Bindings.Broker.DBRole != "meshbox_node_n1_g2" ||
		!strings.Contains(snap.Bindings.Settings["forge.url"], "ci:xxxxx@forge.example.org") {
		t.Errorf("cache show --json hid more than secrets: %+v", snap.Bindings)
	}
	if out := c.ok(t, "cache", "diff", "1", "2"); !strings.Contains(out, `"4" -> "8"`) {
		t.Errorf("cache diff lost a plain change:\n%s", out)
	}
	// --reveal: whoever can read the file sees what is in it.
	for _, args := range [][]string{{"cache", "show", "--reveal"}, {"cache", "show", "--json", "--reveal"}} {
		out := c.ok(t, args...)
		for _, s := range []string{"GRANTPW", "BROKERPW", "SETTINGKEYPW2", "OVERRIDEPW", "DBROLEPW"} {
			if !strings.Contains(out, s) {
				t.Errorf("meshbox %s does not show %s:\n%s", strings.Join(args, " "), s, out)
			}
		}
	}
}
