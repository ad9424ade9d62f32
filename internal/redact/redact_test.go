package redact

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"", ""},
		{"postgres://attic:hunter2@db.example.org/mesh", "postgres://attic:xxxxx@db.example.org/mesh"},
		{"postgres://attic@db.example.org/mesh", "postgres://attic@db.example.org/mesh"},
		{"amqps://node.a.g1:p%40ss@broker:5671/mesh", "amqps://node.a.g1:xxxxx@broker:5671/mesh"},
		{"postgres://h/db?sslmode=verify-full&password=hunter2", "postgres://h/db?password=xxxxx&sslmode=verify-full"},
		{"https://api.example/x?access_token=abc&page=2", "https://api.example/x?access_token=xxxxx&page=2"},
		{"https://api.example/x?page=2", "https://api.example/x?page=2"},
		{"https://h/?sig=abc", "https://h/?sig=xxxxx"},
		{"not a url", "not a url"},
		{"postgres://u:pa ss@h:bad port/db", "postgres://u:xxxxx@h:bad port/db"},
		{"amqp://u:p%zz@h/", "amqp://u:xxxxx@h/"},
		// several broker URLs: every password hidden, not only the first
		{"amqp://u:secret@a:1/v,amqp://u:secret@b:2/v", "amqp://u:xxxxx@a:1/v,amqp://u:xxxxx@b:2/v"},
		{"amqps://u:s1@a/v,amqps://u:s2@b/v,amqps://c/v", "amqps://u:xxxxx@a/v,amqps://u:xxxxx@b/v,amqps://c/v"},
	} {
		if got := URL(tt.in); got != tt.want {
			t.Errorf("URL(%q): got %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestKeyAndValue(t *testing.T) {
	for _, tt := range []struct {
		key, v, want string
	}{
		{"smtp_password", "hunter2", Mask},
		{"API_KEY", "abc", Mask},
		{"github.token", "ghp_x", Mask},
		{"db.credentials", "x", Mask},
		{"private_key", "-----BEGIN", Mask},
		{"Authorization", "Bearer x", Mask},
		{"password", "", ""},
		{"retention", "30d", "30d"},
		{"backup.url", "s3://AKIA:secretkey@bucket/x", "s3://AKIA:xxxxx@bucket/x"},
		{"note", "see postgres://u:p@h/db for details", "see postgres://u:xxxxx@h/db for details"},
		{"key", "sys.hello", "sys.hello"},
	} {
		if got := Value(tt.key, tt.v); got != tt.want {
			t.Errorf("Value(%q, %q): got %q, want %q", tt.key, tt.v, got, tt.want)
		}
	}
}

func TestText(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"plain words", "plain words"},
		{`dial "amqp://u:pw@h:5672/" failed`, `dial "amqp://u:xxxxx@h:5672/" failed`},
		{"a=postgres://x:y@h/db,b=amqp://c:d@e/", "a=postgres://x:xxxxx@h/db,b=amqp://c:xxxxx@e/"},
		{"(https://h/?token=t)", "(https://h/?token=xxxxx)"},
	} {
		if got := Text(tt.in); got != tt.want {
			t.Errorf("Text(%q): got %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewHandler(slog.NewTextHandler(&buf, nil))).With("db", "postgres://u:dbpass@h/db")
	log.Info("connect to amqp://u:msgpass@h/ failed",
		"err", errors.New("dial postgres://u:errpass@h/db: refused"),
		"password", "attrpass",
		slog.Group("link", "url", "amqps://u:grouppass@h/", "api_token", "tok"),
		"n", 3)
	out := buf.String()
	for _, secret := range []string{"dbpass", "msgpass", "errpass", "attrpass", "grouppass", "tok "} {
		if strings.Contains(out, secret) {
			t.Errorf("log line holds %q: %s", secret, out)
		}
	}
	for _, kept := range []string{"n=3", "postgres://u:xxxxx@h/db", "link.url=amqps://u:xxxxx@h/"} {
		if !strings.Contains(out, kept) {
			t.Errorf("log line lost %q: %s", kept, out)
		}
	}
}
