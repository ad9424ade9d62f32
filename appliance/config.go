package appliance

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/brokerurl"
	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/redact"
	"github.com/meshbox/meshbox/node"
)

// Config is the whole configuration of one node. It is built once, at the
// edge, in this order: DefaultConfig, then the config file, then the
// environment (MESHBOX_*), then command-line flags; and validated once with
// Validate. No other package reads flags, files or the environment.
//
// The config file is JSON; its keys are the json tags below and those of
// bridge.Config, read once (settings.go). Durations are strings in Go's
// notation ("5s", "2m30s"). Unknown keys are an error, so a misspelt key
// is never silently ignored.
type Config struct {
	// Node is this node's mesh name: its identity on the broker and in the
	// mesh database. Letters, digits, '-' and '_', at most 64.
	Node string `json:"node"`
	// DataDir holds the bindings cache and the outbox. One node per data
	// directory: a second process is refused.
	DataDir string `json:"data"`
	// NATS is where the embedded NATS server listens for local programs
	// (host:port; port 0 picks a free one).
	NATS string `json:"nats"`
	// HTTP is where status, health and metrics are served (host:port; port 0
	// picks a free one; "off" disables the listener).
	HTTP string `json:"http"`
	// Pprof serves Go's profiles (/debug/pprof/) on the HTTP listener, for
	// an operator to take a heap or CPU profile. Off by default; only on a
	// loopback listener.
	Pprof bool `json:"pprof"`
	// DB is the mesh database URL (postgres://...). Empty: no database; the
	// node runs standalone.
	DB Secret `json:"db"`
	// Broker overrides the broker.url mesh setting (amqp:// or amqps://;
	// several brokers, the nodes of a cluster, separated by commas).
	// Empty: the broker named by the bindings, or none.
	Broker Secret `json:"broker"`
	// NATSAnonymous lets programs without a credential onto the embedded
	// NATS server of a node in a mesh (a standalone node always does):
	// they may then do anything but take the node's own subjects. Off by
	// default; warned about in the status when on.
	NATSAnonymous bool `json:"nats_anonymous"`
	// NATSWebSocket is where the embedded NATS server takes WebSocket
	// clients (browser pages with the nats.ws client), host:port; port 0
	// picks a free one. Empty (the default): no WebSocket listener. Off
	// loopback it needs NATSWebSocketCert and NATSWebSocketKey: a
	// credential must never cross a network in the clear. Clients sign
	// in as on the NATS port, with the same programs and rights.
	NATSWebSocket string `json:"nats_websocket"`
	// NATSWebSocketCert and NATSWebSocketKey are the PEM certificate and
	// key of the WebSocket listener's TLS (wss://).
	NATSWebSocketCert string `json:"nats_websocket_cert"`
	NATSWebSocketKey  string `json:"nats_websocket_key"`
	// NATSWebSocketOrigins are the web origins (scheme://host[:port])
	// whose pages may open a WebSocket to the node, beside the node's own
	// HTTP listener: a page of any other site a browser on the machine
	// opens is refused, so that no web site can reach the node's NATS
	// server through its visitor's browser. Clients that are not browsers
	// send no origin and are not concerned.
	NATSWebSocketOrigins []string `json:"nats_websocket_origins"`
	// NATSMQTT is where the embedded NATS server takes MQTT clients
	// (devices: plugs, sensors, Home Assistant), host:port; port 0 picks
	// a free one. Empty (the default): no MQTT listener. Devices sign in
	// with a program's MQTT password (meshbox program add NAME --mqtt);
	// an MQTT topic is the NATS subject with '/' for '.', so events are
	// evt/<topic>. Off loopback without NATSMQTTCert and NATSMQTTKey the
	// passwords cross the network in the clear: the status warns.
	NATSMQTT string `json:"nats_mqtt"`
	// NATSMQTTRetainedMaxBytes bounds the node's store of MQTT retained
	// messages (its own devices' and the mesh's): past it the oldest are
	// dropped from the store.
	NATSMQTTRetainedMaxBytes int64 `json:"nats_mqtt_retained_max_bytes"`
	// NATSMQTTCert and NATSMQTTKey are the PEM certificate and key of the
	// MQTT listener's TLS (mqtts://).
	NATSMQTTCert string `json:"nats_mqtt_cert"`
	NATSMQTTKey  string `json:"nats_mqtt_key"`
	// HTTPHosts are further Host names the HTTP server answers (a reverse
	// proxy's name); it always answers loopback names and its listen
	// address, and refuses every other Host (no DNS rebinding).
	HTTPHosts []string `json:"http_hosts"`

	Log   LogConfig   `json:"log"`
	Cache CacheConfig `json:"cache"`
	// Bridge is the broker part: the bridge's own options, whose fields
	// with a json tag are settings (see bridge.Config); the appliance
	// fills in the others when it starts the bridge.
	Bridge bridge.Config `json:"bridge"`
	Mesh   MeshConfig    `json:"mesh"`
	// Modules is the module supervision part (see ModulesConfig).
	Modules ModulesConfig `json:"modules"`
	// Blobs is the node's blob store (see BlobsConfig).
	Blobs BlobsConfig `json:"blobs"`
	Rows  RowsConfig  `json:"rows"`
}

// LogConfig says how the node logs.
type LogConfig struct {
	Level  string `json:"level"`  // debug, info, warn, error
	Format string `json:"format"` // text or json
}

// CacheConfig is the bindings part of the configuration.
type CacheConfig struct {
	// Keep is how many snapshot versions the cache keeps.
	Keep int `json:"keep"`
	// LoadTimeout bounds how long start-up waits for the database before it
	// falls back to the cache.
	LoadTimeout Duration `json:"load_timeout"`
	// RetryInterval is how often an unreachable database is tried again.
	RetryInterval Duration `json:"retry_interval"`
	// MaxAge raises a warning when bindings are older than this (0: never).
	MaxAge Duration `json:"max_age"`
}

// MeshConfig is the discovery part of the configuration.
type MeshConfig struct {
	// DiscoveryInterval is how often the node probes its neighbours on
	// the ring of peers through the broker: a peer whose connection is
	// gone is noticed within about this interval.
	DiscoveryInterval Duration `json:"discovery_interval"`
	// HeartbeatInterval is how often the node tells its peers it is alive
	// while the mesh has up to 10 nodes; in a larger mesh the interval
	// grows with it, so that a node hears no more heartbeats than in a
	// mesh of 10. A peer that hangs with its broker connection open is
	// noticed within MissedHeartbeats × its interval; one whose
	// connection is gone, by the probes (DiscoveryInterval).
	HeartbeatInterval Duration `json:"heartbeat_interval"`
	// MissedHeartbeats is how many heartbeats a peer may miss before it is
	// marked gone.
	MissedHeartbeats int `json:"missed_heartbeats"`
}

// Default listen addresses.
const (
	DefaultNATS = "127.0.0.1:4222"
	DefaultHTTP = "127.0.0.1:7222"
)

// DefaultConfig returns the configuration of a standalone node: embedded
// NATS and HTTP on loopback, a data directory for this user, no database,
// no broker.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		Node:    SanitizeNodeName(host),
		DataDir: DefaultDataDir(),
		NATS:    DefaultNATS,
		HTTP:    DefaultHTTP,
		Log:     LogConfig{Level: "info", Format: "text"},
		// Each default is its component's (one home each); the test of the
		// configuration reference checks the page shows these.
		Cache: CacheConfig{
			Keep:          cache.DefaultKeep,
			LoadTimeout:   Duration(cache.DefaultLoadTimeout),
			RetryInterval: Duration(cache.DefaultRetryInterval),
			MaxAge:        Duration(cache.DefaultMaxAge),
		},
		Bridge: bridge.Config{
			OutboxMaxBytes:   bridge.DefaultOutboxMaxBytes,
			RequestTimeout:   bridge.DefaultRequestTimeout,
			CommandTimeout:   bridge.DefaultCommandTimeout,
			Prefetch:         bridge.DefaultPrefetch,
			MaxStagePrefetch: bridge.DefaultMaxStagePrefetch,
			CommandBatch:     bridge.DefaultCommandBatch,
			RetryBudget:      bridge.DefaultRetryBudget,
			Heartbeat:        bridge.DefaultHeartbeat,
			StallAfter:       bridge.DefaultStallAfter,
		},
		Mesh: MeshConfig{
			DiscoveryInterval: Duration(node.DefaultDiscoveryInterval),
			HeartbeatInterval: Duration(node.DefaultHeartbeatInterval),
			MissedHeartbeats:  node.DefaultMissedHeartbeats,
		},
		Modules: defaultModulesConfig(),
		Blobs:   defaultBlobsConfig(),
		Rows:    RowsConfig{SnapshotEvery: rows.DefaultSnapshotEvery},

		NATSMQTTRetainedMaxBytes: DefaultMQTTRetainedMaxBytes,
	}
}

// DefaultDataDir is /var/lib/meshbox for root and the user's data directory
// ($XDG_DATA_HOME/meshbox or ~/.local/share/meshbox) for everyone else.
func DefaultDataDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/meshbox"
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "meshbox")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "share", "meshbox")
	}
	return "meshbox-data"
}

// ValidNodeName reports whether name can be a node's mesh name: it is used as
// a NATS subject token and an AMQP exchange name, so it is kept to letters,
// digits, '-' and '_' (see package names).
func ValidNodeName(name string) bool { return names.Node(name) == nil }

// SanitizeNodeName turns a host name into a valid node name: the first label
// only, other characters replaced by '-'.
func SanitizeNodeName(host string) string { return names.NodeFromHost(host) }

// InMesh reports whether the node belongs to a mesh (it has a database or
// a broker); otherwise it is standalone.
func (c *Config) InMesh() bool { return c.DB != "" || c.Broker != "" }

// FieldError is a validation error that names the config field at fault.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return "config: " + e.Field + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// Validate checks every field and returns all problems found, each naming
// its field.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Err: fmt.Errorf(format, args...)})
	}
	if err := names.Node(c.Node); err != nil {
		bad("node", "%w", err)
	}
	if strings.TrimSpace(c.DataDir) == "" {
		bad("data", "must not be empty")
	}
	if err := checkHostPort(c.NATS); err != nil {
		bad("nats", "%v", err)
	}
	for _, e := range c.checkMQTT() {
		bad(e.Field, "%w", e.Err)
	}
	for _, e := range c.checkWebSocket() {
		bad(e.Field, "%w", e.Err)
	}
	if c.HTTP != "off" {
		if err := checkHostPort(c.HTTP); err != nil {
			bad("http", "%v", err)
		}
	}
	if c.Pprof && (c.HTTP == "off" || !LoopbackAddr(c.HTTP)) {
		// Profiles show the process's memory: never off this machine.
		bad("pprof", "needs the HTTP listener on loopback, got http %q", c.HTTP)
	}
	for i, h := range c.HTTPHosts {
		if h == "" || strings.ContainsAny(h, "/ @") {
			bad(fmt.Sprintf("http_hosts[%d]", i), "%q is not a host name", h)
		}
	}
	if c.DB != "" {
		if err := checkURL(string(c.DB), "postgres", "postgresql"); err != nil {
			bad("db", "%v", err)
		}
	}
	if c.Broker != "" {
		urls := brokerurl.Split(string(c.Broker))
		for i, u := range urls {
			field := "broker"
			if len(urls) > 1 {
				field = fmt.Sprintf("broker[%d]", i)
			}
			if u == "" {
				bad(field, "empty URL (several brokers are separated by single commas)")
			} else if err := checkURL(u, "amqp", "amqps"); err != nil {
				bad(field, "%v", err)
			}
		}
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		bad("log.format", "%q is not one of text, json", c.Log.Format)
	}
	if c.Cache.Keep < 1 || c.Cache.Keep > 1000 {
		bad("cache.keep", "%d is out of range 1..1000", c.Cache.Keep)
	}
	key := func(p any) string { return c.key(p) }
	positive := map[string]time.Duration{
		key(&c.Cache.LoadTimeout):      c.Cache.LoadTimeout.D(),
		key(&c.Cache.RetryInterval):    c.Cache.RetryInterval.D(),
		key(&c.Bridge.RequestTimeout):  c.Bridge.RequestTimeout,
		key(&c.Bridge.CommandTimeout):  c.Bridge.CommandTimeout,
		key(&c.Bridge.Heartbeat):       c.Bridge.Heartbeat,
		key(&c.Bridge.StallAfter):      c.Bridge.StallAfter,
		key(&c.Mesh.DiscoveryInterval): c.Mesh.DiscoveryInterval.D(),
		key(&c.Mesh.HeartbeatInterval): c.Mesh.HeartbeatInterval.D(),
	}
	for _, f := range sortedKeys(positive) {
		if positive[f] <= 0 {
			bad(f, "must be a positive duration, got %s", positive[f])
		}
	}
	br := &c.Bridge
	if br.CommandTimeout > 25*time.Minute {
		// RabbitMQ closes the channel of a delivery unacked for 30 minutes.
		bad(key(&br.CommandTimeout), "%s is above the maximum of 25m", br.CommandTimeout)
	}
	if ml := br.MaxLease; ml != 0 && (ml < br.CommandTimeout || ml > 25*time.Minute) {
		bad(key(&br.MaxLease), "%s is out of range %s (%s)..25m", br.MaxLease, br.CommandTimeout, key(&br.CommandTimeout))
	}
	if c.Cache.MaxAge < 0 {
		bad(key(&c.Cache.MaxAge), "must not be negative")
	}
	if br.OutboxMaxBytes < 1<<20 {
		bad(key(&br.OutboxMaxBytes), "%d is below the minimum of 1 MiB", br.OutboxMaxBytes)
	}
	if br.Prefetch < 1 || br.Prefetch > 10000 {
		bad(key(&br.Prefetch), "%d is out of range 1..10000", br.Prefetch)
	}
	if br.CommandBatch < 1 || br.CommandBatch > bridge.MaxCommandBatch {
		bad(key(&br.CommandBatch), "%d is out of range 1..%d", br.CommandBatch, bridge.MaxCommandBatch)
	}
	if br.MaxStagePrefetch < br.Prefetch || br.MaxStagePrefetch > 65535 {
		bad(key(&br.MaxStagePrefetch), "%d is out of range %d (%s)..65535", br.MaxStagePrefetch, br.Prefetch, key(&br.Prefetch))
	}
	if br.RetryBudget < 1 || br.RetryBudget > 1000 {
		bad(key(&br.RetryBudget), "%d is out of range 1..1000", br.RetryBudget)
	}
	if br.CAFile != "" {
		if _, err := os.Stat(br.CAFile); err != nil {
			bad(key(&br.CAFile), "%v", err)
		}
	}
	switch {
	case (br.CertFile == "") != (br.KeyFile == ""):
		bad(key(&br.CertFile), "a client certificate needs both %s and %s", key(&br.CertFile), key(&br.KeyFile))
	case br.CertFile != "":
		if _, err := tls.LoadX509KeyPair(br.CertFile, br.KeyFile); err != nil {
			bad(key(&br.CertFile), "%v", err)
		}
	}
	for _, stage := range sortedKeys(br.Dedupe) {
		if err := bridge.CheckDedupe(stage, br.Dedupe[stage]); err != nil {
			bad(key(&br.Dedupe), "%v", err)
		}
	}
	for _, stage := range sortedKeys(br.Retry) {
		if err := bridge.CheckRetry(stage, br.Retry[stage]); err != nil {
			bad(key(&br.Retry), "%v", err)
		}
	}
	for _, capName := range sortedKeys(br.Routes) {
		if err := names.Capability(capName); err != nil {
			bad(key(&br.Routes), "%w", err)
		}
		if err := names.Node(br.Routes[capName]); err != nil {
			bad(key(&br.Routes)+"."+capName, "%w", err)
		}
	}
	if c.Mesh.MissedHeartbeats < 1 || c.Mesh.MissedHeartbeats > 100 {
		bad("mesh.missed_heartbeats", "%d is out of range 1..100", c.Mesh.MissedHeartbeats)
	}
	c.Modules.validate(bad)
	c.Blobs.validate(bad)
	if n := c.NATSMQTTRetainedMaxBytes; n < minMQTTRetainedBytes || n > maxMQTTRetainedBytes {
		bad("nats_mqtt_retained_max_bytes", "%d is out of range 1 MiB..1 TiB", n)
	}
	if n := c.Rows.SnapshotEvery; n < minSnapshotEvery || n > maxSnapshotEvery {
		bad("rows.snapshot_every", "%d is out of range %d..%d", n, minSnapshotEvery, maxSnapshotEvery)
	}
	return errors.Join(errs...)
}

func checkHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port", addr)
	}
	if host == "" {
		return fmt.Errorf("%q has no host (use 127.0.0.1 for loopback)", addr)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("%q has no valid port (0 to 65535)", addr)
	}
	return nil
}

func checkURL(raw string, schemes ...string) error {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse quotes the input, which may hold a password.
		return fmt.Errorf("not a valid URL")
	}
	for _, s := range schemes {
		if u.Scheme == s {
			if u.Host == "" {
				return fmt.Errorf("URL has no host")
			}
			return nil
		}
	}
	return fmt.Errorf("URL scheme %q is not one of %s", u.Scheme, strings.Join(schemes, ", "))
}

// Secret is a string that may hold a password (a URL with credentials). It
// prints redacted in logs and in fmt; use string(s) where the real value is
// needed.
type Secret string

// String returns s with any password replaced by "xxxxx".
func (s Secret) String() string { return RedactURL(string(s)) }

// LogValue returns the redacted form for slog.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// RedactURL hides the password and secret query parameters of a URL
// (package redact).
func RedactURL(raw string) string { return redact.URL(raw) }

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
