package appliance

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		field  string // "" = valid
	}{
		{"defaults", func(c *Config) {}, ""},
		{"node empty", func(c *Config) { c.Node = "" }, "node"},
		{"node with dot", func(c *Config) { c.Node = "a.b" }, "node"},
		{"node too long", func(c *Config) { c.Node = strings.Repeat("a", 65) }, "node"},
		{"data empty", func(c *Config) { c.DataDir = " " }, "data"},
		{"nats no port", func(c *Config) { c.NATS = "127.0.0.1" }, "nats"},
		{"nats port out of range", func(c *Config) { c.NATS = "127.0.0.1:70000" }, "nats"},
		{"nats no host", func(c *Config) { c.NATS = ":4222" }, "nats"},
		{"nats port zero", func(c *Config) { c.NATS = "127.0.0.1:0" }, ""},
		{"websocket loopback", func(c *Config) { c.NATSWebSocket = "127.0.0.1:7223" }, ""},
		{"websocket any port", func(c *Config) { c.NATSWebSocket = "127.0.0.1:0" }, ""},
		{"websocket not host:port", func(c *Config) { c.NATSWebSocket = "7223" }, "nats_websocket"},
		{"websocket off loopback without TLS", func(c *Config) { c.NATSWebSocket = "0.0.0.0:7223" }, "nats_websocket"},
		{"websocket on the NATS port", func(c *Config) { c.NATSWebSocket = c.NATS }, "nats_websocket"},
		{"websocket cert without key", func(c *Config) { c.NATSWebSocket, c.NATSWebSocketCert = "127.0.0.1:7223", "/etc/hosts" }, "nats_websocket_cert"},
		{"websocket cert missing", func(c *Config) {
			c.NATSWebSocket, c.NATSWebSocketCert, c.NATSWebSocketKey = "0.0.0.0:7223", "/nonexistent/ws.pem", "/etc/hosts"
		}, "nats_websocket_cert"},
		{"websocket TLS off loopback", func(c *Config) {
			c.NATSWebSocket, c.NATSWebSocketCert, c.NATSWebSocketKey = "0.0.0.0:7223", "/etc/hosts", "/etc/hosts"
		}, ""},
		{"websocket origin", func(c *Config) {
			c.NATSWebSocket, c.NATSWebSocketOrigins = "127.0.0.1:7223", []string{"https://dash.example.org", "http://127.0.0.1:8080"}
		}, ""},
		{"websocket origin with a path", func(c *Config) {
			c.NATSWebSocket, c.NATSWebSocketOrigins = "127.0.0.1:7223", []string{"https://dash.example.org/app"}
		}, "nats_websocket_origins[0]"},
		{"websocket origin not http", func(c *Config) {
			c.NATSWebSocket, c.NATSWebSocketOrigins = "127.0.0.1:7223", []string{"*"}
		}, "nats_websocket_origins[0]"},
		{"websocket origins without a listener", func(c *Config) { c.NATSWebSocketOrigins = []string{"https://a.example"} }, "nats_websocket"},
		{"http off", func(c *Config) { c.HTTP = "off" }, ""},
		{"http bad", func(c *Config) { c.HTTP = "localhost:x" }, "http"},
		{"db wrong scheme", func(c *Config) { c.DB = "mysql://h/db" }, "db"},
		{"db ok", func(c *Config) { c.DB = "postgres://u:p@h:5432/db" }, ""},
		{"broker wrong scheme", func(c *Config) { c.Broker = "http://h" }, "broker"},
		{"broker no host", func(c *Config) { c.Broker = "amqp://" }, "broker"},
		{"broker tls", func(c *Config) { c.Broker = "amqps://u:p@h:5671/vh" }, ""},
		{"brokers of a cluster", func(c *Config) { c.Broker = "amqps://u:p@a:5671/vh, amqps://u:p@b:5671/vh" }, ""},
		{"brokers one bad", func(c *Config) { c.Broker = "amqps://u:p@a:5671/vh,http://b" }, "broker[1]"},
		{"brokers empty one", func(c *Config) { c.Broker = "amqps://u:p@a:5671/vh,,amqps://u:p@b/vh" }, "broker[1]"},
		{"log level", func(c *Config) { c.Log.Level = "loud" }, "log.level"},
		{"log format", func(c *Config) { c.Log.Format = "xml" }, "log.format"},
		{"cache keep", func(c *Config) { c.Cache.Keep = 0 }, "cache.keep"},
		{"load timeout", func(c *Config) { c.Cache.LoadTimeout = 0 }, "cache.load_timeout"},
		{"max age negative", func(c *Config) { c.Cache.MaxAge = -1 }, "cache.max_age"},
		{"outbox small", func(c *Config) { c.Bridge.OutboxMaxBytes = 10 }, "bridge.outbox_max_bytes"},
		{"prefetch", func(c *Config) { c.Bridge.Prefetch = 0 }, "bridge.prefetch"},
		{"retry budget", func(c *Config) { c.Bridge.RetryBudget = 0 }, "bridge.retry_budget"},
		{"blobs max bytes small", func(c *Config) { c.Blobs.MaxBytes = 1000 }, "blobs.max_bytes"},
		{"blobs max bytes huge", func(c *Config) { c.Blobs.MaxBytes = 1 << 50 }, "blobs.max_bytes"},
		{"blobs max age short", func(c *Config) { c.Blobs.MaxAge = Duration(time.Millisecond) }, "blobs.max_age"},
		{"blobs max age", func(c *Config) { c.Blobs.MaxAge = Duration(30 * 24 * time.Hour) }, ""},
		{"request timeout", func(c *Config) { c.Bridge.RequestTimeout = -time.Second }, "bridge.request_timeout"},
		{"command timeout zero", func(c *Config) { c.Bridge.CommandTimeout = 0 }, "bridge.command_timeout"},
		{"command timeout too long", func(c *Config) { c.Bridge.CommandTimeout = time.Hour }, "bridge.command_timeout"},
		{"max lease below command timeout", func(c *Config) { c.Bridge.MaxLease = time.Second }, "bridge.max_lease"},
		{"max lease too long", func(c *Config) { c.Bridge.MaxLease = time.Hour }, "bridge.max_lease"},
		{"dedupe bad stage", func(c *Config) {
			c.Bridge.Dedupe = map[string]bridge.DedupePolicy{"a b": {Window: time.Hour, MaxEntries: 10}}
		}, "bridge.dedupe"},
		{"dedupe no window", func(c *Config) { c.Bridge.Dedupe = map[string]bridge.DedupePolicy{"once": {MaxEntries: 10}} }, "bridge.dedupe"},
		{"retry bad stage", func(c *Config) {
			c.Bridge.Retry = map[string]bridge.RetryPolicy{"a b": {Attempts: 3, Backoff: time.Second}}
		}, "bridge.retry"},
		{"retry no attempts", func(c *Config) { c.Bridge.Retry = map[string]bridge.RetryPolicy{"r": {Backoff: time.Second}} }, "bridge.retry"},
		{"retry no backoff", func(c *Config) { c.Bridge.Retry = map[string]bridge.RetryPolicy{"r": {Attempts: 3}} }, "bridge.retry"},
		{"retry max below backoff", func(c *Config) {
			c.Bridge.Retry = map[string]bridge.RetryPolicy{"r": {Attempts: 3, Backoff: time.Second, MaxBackoff: time.Millisecond * 500}}
		}, "bridge.retry"},
		{"dedupe no bound", func(c *Config) { c.Bridge.Dedupe = map[string]bridge.DedupePolicy{"once": {Window: time.Hour}} }, "bridge.dedupe"},
		{"max lease negative", func(c *Config) { c.Bridge.MaxLease = -time.Minute }, "bridge.max_lease"},
		{"ca file missing", func(c *Config) { c.Bridge.CAFile = "/nonexistent/ca.pem" }, "bridge.ca_file"},
		{"cert without key", func(c *Config) { c.Bridge.CertFile = "/nonexistent/c.pem" }, "bridge.cert_file"},
		{"key without cert", func(c *Config) { c.Bridge.KeyFile = "/nonexistent/k.pem" }, "bridge.cert_file"},
		{"cert files missing", func(c *Config) { c.Bridge.CertFile, c.Bridge.KeyFile = "/nonexistent/c.pem", "/nonexistent/k.pem" }, "bridge.cert_file"},
		{"http host with slash", func(c *Config) { c.HTTPHosts = []string{"a/b"} }, "http_hosts[0]"},
		{"http host empty", func(c *Config) { c.HTTPHosts = []string{"ok.example", ""} }, "http_hosts[1]"},
		{"http hosts ok", func(c *Config) { c.HTTPHosts = []string{"status.example.org", "::1"} }, ""},
		{"route bad cap", func(c *Config) { c.Bridge.Routes = map[string]string{"a.*": "b"} }, "bridge.routes"},
		{"route bad node", func(c *Config) { c.Bridge.Routes = map[string]string{"echo": "b c"} }, "bridge.routes.echo"},
		{"missed heartbeats", func(c *Config) { c.Mesh.MissedHeartbeats = 0 }, "mesh.missed_heartbeats"},
		{"modules dir", func(c *Config) { c.Modules.Dir = "/srv/modules" }, ""},
		{"modules restart min", func(c *Config) { c.Modules.RestartMin = 0 }, "modules.restart_min"},
		{"modules restart max below min", func(c *Config) { c.Modules.RestartMax = Duration(time.Millisecond) }, "modules.restart_max"},
		{"modules crash loop restarts", func(c *Config) { c.Modules.CrashLoopRestarts = 0 }, "modules.crash_loop_restarts"},
		{"modules crash loop window", func(c *Config) { c.Modules.CrashLoopWindow = -1 }, "modules.crash_loop_window"},
		{"modules crash loop retry", func(c *Config) { c.Modules.CrashLoopRetry = 0 }, "modules.crash_loop_retry"},
		{"modules log lines", func(c *Config) { c.Modules.LogLines = 0 }, "modules.log_lines"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Node = "alpha"
			tt.mutate(&c)
			err := c.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("got error %v, want none", err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("got %v, want a FieldError for %s", err, tt.field)
			}
			if !strings.Contains(err.Error(), "config: "+tt.field+":") {
				t.Fatalf("got %q, want it to name field %s", err, tt.field)
			}
		})
	}
}

func TestConfigValidateDoesNotLeakPasswords(t *testing.T) {
	c := DefaultConfig()
	c.Node = "alpha"
	c.DB = "mysql://user:hunter2@h/db"
	err := c.Validate()
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("got %v, want an error without the password", err)
	}
}

func TestConfigLayers(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "meshbox.json")
	if err := os.WriteFile(file, []byte(`{"node":"fromfile","nats":"127.0.0.1:5000","bridge":{"request_timeout":"2s"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	if err := c.LoadFile(file); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"MESHBOX_NATS": "127.0.0.1:6000"}
	if err := c.ApplyEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if c.Node != "fromfile" {
		t.Errorf("node: got %q, want %q (file)", c.Node, "fromfile")
	}
	if c.NATS != "127.0.0.1:6000" {
		t.Errorf("nats: got %q, want %q (env beats file)", c.NATS, "127.0.0.1:6000")
	}
	if c.Bridge.RequestTimeout != 2*time.Second {
		t.Errorf("bridge.request_timeout: got %s, want 2s", c.Bridge.RequestTimeout)
	}
	if c.HTTP != DefaultHTTP {
		t.Errorf("http: got %q, want default %q", c.HTTP, DefaultHTTP)
	}
}

// TestConfigFileRejectsBadInput: each error says the line, its text and
// the field, and what to write instead.
func TestConfigFileRejectsBadInput(t *testing.T) {
	tests := map[string]struct{ body, want string }{
		"unknown key":  {"{\n  \"nod\": \"x\"\n}", `line 2 ("nod": "x"): unknown key "nod" (did you mean "node"?`},
		"far key":      {"{\n  \"zzzzzz\": \"x\"\n}", `unknown key "zzzzzz" (misspelt?`},
		"nested key":   {"{\n  \"bridge\": {\n    \"prefetc\": 1\n  }\n}", `line 3 ("prefetc": 1): unknown key "prefetc" (did you mean "prefetch"?`},
		"bad duration": {"{\"cache\":{\"load_timeout\":\"soon\"}}", `cache.load_timeout: "soon" is not a duration: write a string such as "5s"`},
		"number dur":   {"{\n  \"bridge\": {\n    \"request_timeout\": 5\n  }\n}", `line 3 ("request_timeout": 5): bridge.request_timeout: 5 is not a duration`},
		"wrong type":   {"{\n  \"bridge\": {\"prefetch\": \"x\"}\n}", `line 2 ("bridge": {"prefetch": "x"}): bridge.prefetch: a JSON string where a int belongs`},
		"comma":        {"{\n  \"node\": \"x\",\n}", `line 3 (}): invalid character '}' looking for beginning of object key string (a comma after the last item before it?)`},
		"not json":     {`node = x`, `line 1 (node = x): invalid character 'o' in literal null`},
		"two values":   {`{} {}`, "more than one JSON value"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "c.json")
			if err := os.WriteFile(file, []byte(tt.body), 0o600); err != nil {
				t.Fatal(err)
			}
			c := DefaultConfig()
			err := c.LoadFile(file)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want it to say %q", err, tt.want)
			}
		})
	}
}

func TestSanitizeNodeName(t *testing.T) {
	tests := map[string]string{
		"box1.example.org": "box1",
		"my box":           "my-box",
		"":                 "meshbox",
		"ünï":              "-n-",
	}
	for in, want := range tests {
		if got := SanitizeNodeName(in); got != want || !ValidNodeName(got) {
			t.Errorf("SanitizeNodeName(%q) = %q, want %q (valid)", in, got, want)
		}
	}
}

func TestRedactURL(t *testing.T) {
	tests := map[string]string{
		"amqp://user:secret@host:5672/vh":     "amqp://user:xxxxx@host:5672/vh",
		"postgres://u@h/db":                   "postgres://u@h/db",
		"postgres://h/db?password=secret&x=1": "postgres://h/db?password=xxxxx&x=1",
		"":                                    "",
	}
	for in, want := range tests {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestModulesDir(t *testing.T) {
	for _, tc := range []struct{ data, dir, want string }{
		{"/home/ann/.local/share/meshbox", "", "/home/ann/.local/share/meshbox/modules"},
		{"/var/lib/meshbox", "", "/etc/meshbox/modules"},
		{"/var/lib/meshbox/", "", "/etc/meshbox/modules"},
		{"/var/lib/meshbox", "/srv/modules", "/srv/modules"},
	} {
		c := DefaultConfig()
		c.DataDir, c.Modules.Dir = tc.data, tc.dir
		if got := c.ModulesDir(); got != tc.want {
			t.Errorf("data %q, modules.dir %q: got %q, want %q", tc.data, tc.dir, got, tc.want)
		}
	}
}

func TestNATSAnonymousFromEnvironment(t *testing.T) {
	c := DefaultConfig()
	if c.NATSAnonymous {
		t.Fatal("nats_anonymous is on by default")
	}
	if err := c.ApplyEnv(func(k string) string { return map[string]string{"MESHBOX_NATS_ANONYMOUS": "true"}[k] }); err != nil {
		t.Fatal(err)
	}
	if !c.NATSAnonymous {
		t.Error("MESHBOX_NATS_ANONYMOUS=true: got off, want on")
	}
	if err := c.Set("nats_anonymous", "maybe"); err == nil || !strings.Contains(err.Error(), "nats_anonymous") {
		t.Errorf("nats_anonymous=maybe: got %v, want an error naming the field", err)
	}
	if c.InMesh() {
		t.Error("a config without db or broker is in a mesh")
	}
	c.Broker = "amqp://h/"
	if !c.InMesh() {
		t.Error("a config with a broker is standalone")
	}
}
