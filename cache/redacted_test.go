package cache

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestBindingsRedactedHidesSecretsAndLeavesTheOriginal(t *testing.T) {
	b := Bindings{
		Node:      "n1",
		Settings:  map[string]string{"forge.url": "https://u:SETPW@h/", "api_token": "SETTOK", "plain": "v"},
		Overrides: []Override{{Module: "m", Key: "password", Value: "OVRPW"}, {Module: "m", Key: "threads", Value: "4"}},
		Grants:    []Grant{{Consumer: "n1", Resource: "r", Provider: "p", Credential: "GRANTPW"}},
		Broker:    &BrokerCredential{User: "node.n1.g1", Password: "BROKERPW", DBRole: "meshbox_node_n1_g1", DBPassword: "DBROLEPW"},
	}
	data, err := json.Marshal(b.Redacted())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"SETPW", "SETTOK", "OVRPW", "GRANTPW", "BROKERPW", "DBROLEPW"} {
		if strings.Contains(string(data), s) {
			t.Errorf("redacted bindings hold %s: %s", s, data)
		}
	}
	for _, s := range []string{`"plain":"v"`, `"value":"4"`, `"user":"node.n1.g1"`, `"db_role":"meshbox_node_n1_g1"`} {
		if !strings.Contains(string(data), s) {
			t.Errorf("redacted bindings lost %s: %s", s, data)
		}
	}
	if b.Settings["api_token"] != "SETTOK" || b.Overrides[0].Value != "OVRPW" || b.Grants[0].Credential != "GRANTPW" || b.Broker.Password != "BROKERPW" || b.Broker.DBPassword != "DBROLEPW" {
		t.Errorf("Redacted changed the original: %+v %+v", b, *b.Broker)
	}
}
