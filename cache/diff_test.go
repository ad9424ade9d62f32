package cache

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestDiff(t *testing.T) {
	base := func() Bindings {
		return Bindings{
			Node:        "n1",
			Nodes:       []NodeRecord{{Name: "n1", PublicName: "a.example"}, {Name: "n2"}},
			Settings:    map[string]string{"broker.url": "amqp://guest:pw1@h1/", "forge.url": "https://forge"},
			Assignments: []Assignment{{Module: "photos", Selection: "main", Autostart: true}},
			Overrides:   []Override{{Module: "photos", Key: "threads", Value: "4"}, {Module: "photos", Key: "db.password", Value: "s3cret"}},
			Grants:      []Grant{{Consumer: "n1", Resource: "bucket", Provider: "n2", Credential: "cred-1"}},
		}
	}
	tests := []struct {
		name   string
		change func(b *Bindings)
		want   []string
	}{
		{"identical", func(*Bindings) {}, nil},
		{"order does not matter", func(b *Bindings) {
			b.Nodes[0], b.Nodes[1] = b.Nodes[1], b.Nodes[0]
			b.Overrides[0], b.Overrides[1] = b.Overrides[1], b.Overrides[0]
		}, nil},
		{"node added", func(b *Bindings) { b.Nodes = append(b.Nodes, NodeRecord{Name: "n3", Identity: "key"}) },
			[]string{`node n3 added: public_name="" identity="key"`}},
		{"node removed", func(b *Bindings) { b.Nodes = b.Nodes[:1] },
			[]string{`node n2 removed (was public_name="" identity="")`}},
		{"node public name changed", func(b *Bindings) { b.Nodes[0].PublicName = "b.example" },
			[]string{`node n1 changed: public_name="a.example" identity="" -> public_name="b.example" identity=""`}},
		{"setting changed, URL password redacted", func(b *Bindings) { b.Settings["broker.url"] = "amqp://guest:pw2@h2/" },
			[]string{`setting broker.url changed: "amqp://guest:xxxxx@h1/" -> "amqp://guest:xxxxx@h2/"`}},
		{"setting password-only change still reported", func(b *Bindings) { b.Settings["broker.url"] = "amqp://guest:pw2@h1/" },
			[]string{`setting broker.url changed: "amqp://guest:xxxxx@h1/" (old) -> "amqp://guest:xxxxx@h1/" (new)`}},
		{"setting added and removed", func(b *Bindings) {
			delete(b.Settings, "forge.url")
			b.Settings["registry.url"] = "https://reg"
		}, []string{`setting forge.url removed (was "https://forge")`, `setting registry.url added: "https://reg"`}},
		{"assignment changed", func(b *Bindings) { b.Assignments[0].Autostart = false },
			[]string{`assignment photos changed: selection="main" autostart=true -> selection="main" autostart=false`}},
		{"assignment added", func(b *Bindings) {
			b.Assignments = append(b.Assignments, Assignment{Module: "backup", Selection: "v2"})
		},
			[]string{`assignment backup added: selection="v2" autostart=false`}},
		{"override changed", func(b *Bindings) { b.Overrides[0].Value = "8" },
			[]string{`override photos/threads changed: "4" -> "8"`}},
		{"secret override redacted", func(b *Bindings) { b.Overrides[1].Value = "other" },
			[]string{`override photos/db.password changed: "[redacted]" (old) -> "[redacted]" (new)`}},
		{"override removed", func(b *Bindings) { b.Overrides = b.Overrides[1:] },
			[]string{`override photos/threads removed (was "4")`}},
		{"grant credential rotated", func(b *Bindings) { b.Grants[0].Credential = "cred-2" },
			[]string{`grant n1:bucket@n2 changed: credential [redacted] (old) -> credential [redacted] (new)`}},
		{"grant revoked", func(b *Bindings) { b.Grants = nil },
			[]string{`grant n1:bucket@n2 removed (was credential [redacted])`}},
		{"grant added without credential", func(b *Bindings) {
			b.Grants = append(b.Grants, Grant{Consumer: "n1", Resource: "api", Provider: "n3"})
		}, []string{`grant n1:api@n3 added: no credential`}},
		{"kinds in order", func(b *Bindings) {
			b.Grants = nil
			b.Nodes = b.Nodes[:1]
			b.Settings["a"] = "1"
		}, []string{`node n2 removed (was public_name="" identity="")`, `setting a added: "1"`, `grant n1:bucket@n2 removed (was credential [redacted])`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old, new := base(), base()
			tt.change(&new)
			d := Diff(old, new)
			got := d.Strings()
			if fmt.Sprint(got) != fmt.Sprint(tt.want) || len(got) != len(tt.want) {
				t.Fatalf("diff:\ngot  %q\nwant %q", got, tt.want)
			}
			for _, s := range got {
				for _, secret := range []string{"pw1", "pw2", "s3cret", "other", "cred-1", "cred-2"} {
					if strings.Contains(s, secret) {
						t.Fatalf("diff line %q leaks %q", s, secret)
					}
				}
			}
			if d.Empty() != (len(tt.want) == 0) {
				t.Fatalf("Empty: got %t, want %t", d.Empty(), len(tt.want) == 0)
			}
		})
	}
}

func TestDivergenceSummary(t *testing.T) {
	d := Divergence{{Op: OpAdded}, {Op: OpAdded}, {Op: OpRemoved}, {Op: OpChanged}}
	if got, want := d.Summary(), "2 added, 1 removed, 1 changed"; got != want {
		t.Fatalf("summary: got %q, want %q", got, want)
	}
	if got, want := Divergence(nil).Summary(), "no changes"; got != want {
		t.Fatalf("summary: got %q, want %q", got, want)
	}
}

func TestSecretsNeverLogged(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	b := testBindings(1)
	log.Info("x", "bindings", b, "snapshot", NewSnapshot(3, time.Now(), "db", b), "grant_cred", b.Grants[0].Credential, "divergence", Diff(Bindings{}, b))
	text := buf.String() + fmt.Sprintf("%v %s %+v %#v", b.Grants[0].Credential, b.Grants[0].Credential, b.Grants[0], b.Grants[0])
	for _, secret := range []string{"hunter2", "secret"} {
		if strings.Contains(text, secret) {
			t.Fatalf("log output leaks %q: %s", secret, text)
		}
	}
}

func TestHashIgnoresOrderButNotContent(t *testing.T) {
	a, b := testBindings(1), testBindings(1)
	b.Nodes[0], b.Nodes[1] = b.Nodes[1], b.Nodes[0]
	if a.Hash() != b.Hash() {
		t.Fatalf("hash differs for reordered rows: %s vs %s", a.Hash(), b.Hash())
	}
	b.Grants[0].Credential = "other"
	if a.Hash() == b.Hash() {
		t.Fatal("hash is the same after a credential change, want different")
	}
}
