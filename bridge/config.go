package bridge

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"
	brokerlink "github.com/meshbox/meshbox/bridge/link"

	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/redact"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbox/meshbox/internal/seal"
)

// Config configures a Bridge. Zero values take the documented defaults.
//
// The fields with a json tag are the node's settings of the bridge: the
// tag is the setting's name (the config file's key under "bridge"), read
// once by the appliance, which writes their durations as Go strings
// ("5s"). The others are filled in by the appliance at start.
type Config struct {
	// Node is this node's mesh name ([A-Za-z0-9_-]{1,64}).
	Node string
	// URL is the broker (amqp:// or amqps://), or several brokers (the
	// nodes of a RabbitMQ cluster) as URLs separated by commas
	// (internal/brokerurl); "" runs without a broker (state "none"). The
	// link connects to one picked at random and fails over to the next on
	// loss (see the package doc, Several brokers). SetURL changes it at
	// run time. Its user is the node's broker user (BrokerUser(Node, k))
	// in a mesh of per-node users, or the mesh's one credential (see
	// origin.go); every URL of a list has the same user.
	URL string
	// URLOverride names the setting URL comes from when it overrides the
	// mesh's bindings (say "the node's setting broker (flag --broker, env
	// MESHBOX_BROKER)"); empty when URL follows the bindings. A refused
	// credential is then said to be fixed there: the bindings' next
	// credential would not replace it.
	URLOverride string
	// CAFile is an extra PEM CA bundle trusted for amqps:// brokers.
	CAFile string `json:"ca_file"`
	// CertFile and KeyFile are the node's PEM client certificate and key
	// for amqps:// brokers (both or neither). With them, a URL without a
	// password logs in with SASL EXTERNAL (see clientcert.go).
	CertFile string `json:"cert_file"`
	KeyFile  string `json:"key_file"`
	// OutboxPath is the bbolt file of the durable outbox (<data>/outbox.db).
	OutboxPath string
	// Dedupe names the stages whose completed message ids this node
	// remembers (completed.go): a delivery of an id that completed here
	// within the window is acked without calling the handler.
	Dedupe map[string]DedupePolicy `json:"dedupe"`
	// Retry names the stages with a retry policy (retry.go): a failed
	// attempt waits its backoff in the stage's retry queue and comes back,
	// up to the policy's attempts. Other stages requeue a failed command
	// after a short pause, up to RetryBudget attempts.
	Retry map[string]RetryPolicy `json:"retry"`
	// CompletedPath is the bbolt file of the completed ids (default
	// completed.db next to the outbox); opened only when Dedupe names a
	// stage.
	CompletedPath string
	// OutboxMaxBytes bounds the outbox (default 64 MiB).
	OutboxMaxBytes int64 `json:"outbox_max_bytes"`
	// RequestTimeout is the default deadline of a request (default 5s); a
	// caller's Meshbox-Timeout header sets another, shorter or longer up
	// to wire.MaxTimeout (or RequestTimeout, if that is longer).
	RequestTimeout time.Duration `json:"request_timeout"`
	// CommandTimeout bounds one handler attempt of a command (default 30s,
	// at most 25 minutes so the broker's consumer timeout never fires).
	CommandTimeout time.Duration `json:"command_timeout"`
	// MaxLease bounds how long a handler that keeps sending progress
	// (Meshbox-Progress) may hold one attempt of a command (default 10m, at
	// least CommandTimeout, at most 25 minutes like CommandTimeout).
	MaxLease time.Duration `json:"max_lease"`
	// Prefetch bounds unacknowledged deliveries of the events consumer,
	// and the commands of each consumer of a stage queue (default 32): its
	// prefetch is Prefetch/CommandBatch messages.
	Prefetch int `json:"prefetch"`
	// MaxStagePrefetch bounds the unacknowledged commands of one stage on
	// this node (default 4096; Prefetch when only Prefetch is set, which
	// keeps a fixed credit and one consumer per stage, in the queue's
	// order). Between Prefetch and it, a stage's credit is sized from its
	// handler's measured rate and the link's round trip, and probed: a
	// fast node on a slow link holds what the link needs to keep its pace,
	// a node behind a slow handler about Prefetch commands (see Credit per
	// stage in the package doc).
	MaxStagePrefetch int `json:"max_stage_prefetch"`
	// CommandBatch is the most commands one broker message carries
	// (default DefaultCommandBatch; 1: every command alone; at most
	// MaxCommandBatch). The publisher gathers only commands for one stage
	// that wait at the same moment, and only while every peer reads
	// batches (SetCommandBatching; batch.go). A stage consumer's prefetch
	// is Prefetch/CommandBatch messages, so credit stays about Prefetch
	// commands per consumer.
	CommandBatch int `json:"command_batch"`
	// RetryBudget is how many attempts a command gets before it is
	// dead-lettered (default 5).
	RetryBudget int `json:"retry_budget"`
	// Heartbeat is the AMQP heartbeat (default 5s): a half-open link is
	// detected after about two of them.
	Heartbeat time.Duration `json:"heartbeat"`
	// Routes is the static capability -> node routing for capabilities
	// hosted elsewhere; SetRoutes replaces it at run time.
	Routes map[string]string `json:"routes"`
	// Stages are stages this node hosts even before a local handler
	// subscribes work.<stage>.
	Stages []string
	// StallAfter is the age of a waiting command that raises a stall alarm
	// (default 5m).
	StallAfter time.Duration `json:"stall_after"`
	// StallCheck is how often command queues are inspected (default 10s).
	StallCheck time.Duration
	// MaxPayload bounds a message body (default 1 MiB, and never more than
	// the local NATS server accepts).
	MaxPayload int
	// Dial opens a connection to the node's embedded NATS server with the
	// extra options given (the bridge asks for NoEcho). Required.
	Dial func(opts ...nats.Option) (*nats.Conn, error)
	// Replies, when set, is the connection the bridge answers local
	// clients on (calls, errors, acknowledgements): the node's responder,
	// which may publish on inboxes only. The bridge does not close it.
	// Nil: answers go out on the bridge's own connection.
	Replies *nats.Conn
	// Local, when set, says what local clients may do themselves; the
	// bridge acts on a client's reply subject and result topic only within
	// it (localclients.go). Nil trusts every local client.
	Local LocalRights
	// OnSystem, when set, receives system messages (sys.<key> broadcasts and
	// messages addressed to this node) from other nodes. It is called from
	// one goroutine, in order; it must not block for long.
	OnSystem func(key string, body []byte, origin string)
	// OnNewerGeneration, when set, is called when a delivery comes from a
	// generation of a node's broker user newer than the bindings list (a
	// rotation this node has not read yet), at most once a second: the
	// bindings should be read again now. It must not block.
	OnNewerGeneration func()
	// OnConnected, when set, is called each time the link enters the
	// connected state (after a start, a reconnect, or the end of a resource
	// alarm, or a switch to a new credential), on the goroutine that
	// changed the state. It must not block.
	OnConnected func()
	// OnCredential, when set, is called with the broker user each time the
	// link connects with another user than before (at the first connection,
	// and after a switch to a new credential), on the link's goroutine. It
	// must not block.
	OnCredential func(user string)
	// AcceptedBefore reports whether the broker accepted user for this node
	// before this process (the bindings record the switch to it): a
	// refusal of such a user is a revocation, not a wrong password. nil:
	// only this process's own sessions count.
	AcceptedBefore func(user string) bool
	// ReconnectMin and ReconnectMax bound the reconnect backoff (defaults
	// 250ms and 10s; jitter is added) after attempts that reached the
	// broker. A broker that does not answer TCP is probed instead, every
	// ReconnectMin at most and never more than 200ms apart (jittered), and
	// the link reconnects as soon as it answers.
	ReconnectMin, ReconnectMax time.Duration
	// Keys, when set, seals every request, reply, command and event this
	// node sends (body and application headers) and refuses those from
	// other nodes that do not open (see the package doc, Sealing). The
	// appliance sets it in a mesh; nil sends and takes messages in plain.
	Keys *seal.Keyring
	// Logger receives the bridge's log lines (nil: discarded).
	Logger *slog.Logger
	// Metrics is where the bridge registers its metrics (nil: not
	// registered).
	Metrics prometheus.Registerer
}

// Defaults.
const (
	DefaultOutboxMaxBytes   = 64 << 20
	DefaultRequestTimeout   = 5 * time.Second
	DefaultCommandTimeout   = 30 * time.Second
	DefaultMaxLease         = 10 * time.Minute
	DefaultPrefetch         = 32
	DefaultMaxStagePrefetch = 4096
	DefaultRetryBudget      = 5
	DefaultHeartbeat        = 5 * time.Second
	DefaultStallAfter       = 5 * time.Minute
	DefaultStallCheck       = 10 * time.Second
	DefaultMaxPayload       = 1 << 20
	maxCommandTimeout       = 25 * time.Minute
)

// BatchStatus is the part of the broker status that reports the setting
// CommandBatch as it applies now.
type BatchStatus struct {
	// CommandBatch is the most commands one broker message of this node
	// carries now: Config.CommandBatch while every peer reads batches, 1
	// while one does not (an older meshbox is up) or before discovery
	// said so.
	CommandBatch int `json:"command_batch"`
}

// LogValue prints the configuration with the broker password redacted.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("node", c.Node),
		slog.String("url", redactURL(c.URL)),
		slog.String("outbox", c.OutboxPath),
		slog.Int64("outbox_max_bytes", c.OutboxMaxBytes),
	)
}

// withDefaults returns c with zero values replaced by defaults.
func (c Config) withDefaults() Config {
	if c.OutboxMaxBytes == 0 {
		c.OutboxMaxBytes = DefaultOutboxMaxBytes
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.CommandTimeout == 0 {
		c.CommandTimeout = DefaultCommandTimeout
	}
	if c.CompletedPath == "" && c.OutboxPath != "" {
		c.CompletedPath = filepath.Join(filepath.Dir(c.OutboxPath), "completed.db")
	}
	if c.MaxLease == 0 {
		c.MaxLease = max(DefaultMaxLease, c.CommandTimeout)
	}
	if c.MaxStagePrefetch == 0 {
		c.MaxStagePrefetch = c.Prefetch // a prefetch set alone stays fixed
		if c.Prefetch == 0 {
			c.MaxStagePrefetch = DefaultMaxStagePrefetch
		}
	}
	if c.Prefetch == 0 {
		c.Prefetch = DefaultPrefetch
	}
	if c.CommandBatch == 0 {
		c.CommandBatch = DefaultCommandBatch
	}
	if c.RetryBudget == 0 {
		c.RetryBudget = DefaultRetryBudget
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.StallAfter == 0 {
		c.StallAfter = DefaultStallAfter
	}
	if c.StallCheck == 0 {
		c.StallCheck = DefaultStallCheck
	}
	if c.MaxPayload == 0 {
		c.MaxPayload = DefaultMaxPayload
	}
	if c.ReconnectMin == 0 {
		c.ReconnectMin = 250 * time.Millisecond
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// validate checks a configuration that went through withDefaults.
func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case !codec.ValidNodeName(c.Node):
		return bad("Node", "%q is not a valid node name (letters, digits, '-', '_'; 1 to 64)", c.Node)
	case c.OutboxPath == "":
		return bad("OutboxPath", "must not be empty")
	case c.OutboxMaxBytes < 1<<16:
		return bad("OutboxMaxBytes", "%d is below the minimum of 64 KiB", c.OutboxMaxBytes)
	case c.RequestTimeout < 0:
		return bad("RequestTimeout", "%s is negative", c.RequestTimeout)
	case c.CommandTimeout < 0 || c.CommandTimeout > maxCommandTimeout:
		return bad("CommandTimeout", "%s is out of range 0..%s", c.CommandTimeout, maxCommandTimeout)
	case c.MaxLease < c.CommandTimeout || c.MaxLease > maxCommandTimeout:
		return bad("MaxLease", "%s is out of range %s (CommandTimeout)..%s", c.MaxLease, c.CommandTimeout, maxCommandTimeout)
	case c.Prefetch < 1 || c.Prefetch > 65535:
		return bad("Prefetch", "%d is out of range 1..65535", c.Prefetch)
	case c.MaxStagePrefetch < c.Prefetch || c.MaxStagePrefetch > 65535:
		return bad("MaxStagePrefetch", "%d is out of range %d (Prefetch)..65535", c.MaxStagePrefetch, c.Prefetch)
	case c.CommandBatch < 1 || c.CommandBatch > MaxCommandBatch:
		return bad("CommandBatch", "%d is out of range 1..%d", c.CommandBatch, MaxCommandBatch)
	case c.RetryBudget < 1 || c.RetryBudget > 1000:
		return bad("RetryBudget", "%d is out of range 1..1000", c.RetryBudget)
	case c.Heartbeat < time.Second:
		return bad("Heartbeat", "%s is below 1s", c.Heartbeat)
	case c.StallAfter < 0 || c.StallCheck < 0:
		return bad("StallAfter", "must not be negative")
	case c.MaxPayload < 1:
		return bad("MaxPayload", "%d is not positive", c.MaxPayload)
	case c.ReconnectMin <= 0 || c.ReconnectMax < c.ReconnectMin:
		return bad("ReconnectMin", "backoff bounds %s..%s are not increasing", c.ReconnectMin, c.ReconnectMax)
	case c.Dial == nil:
		return bad("Dial", "is required (a function that connects to the embedded NATS server)")
	}
	for stage, p := range c.Dedupe {
		if err := CheckDedupe(stage, p); err != nil {
			return bad("Dedupe", "%v", err)
		}
	}
	for stage, p := range c.Retry {
		if err := CheckRetry(stage, p); err != nil {
			return bad("Retry", "%v", err)
		}
	}
	if err := brokerlink.CheckURL(c.URL, c.Node); err != nil {
		return bad("URL", "%v", err)
	}
	if c.CAFile != "" {
		if _, err := os.Stat(c.CAFile); err != nil {
			return bad("CAFile", "%v", err)
		}
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return bad("CertFile", "a client certificate needs both CertFile and KeyFile")
	}
	if c.CertFile != "" {
		if _, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile); err != nil {
			return bad("CertFile", "%v", err)
		}
	}
	for capName, node := range c.Routes {
		if !codec.ValidName(capName) {
			return bad("Routes", "%q is not a valid capability name", capName)
		}
		if !codec.ValidNodeName(node) {
			return bad("Routes."+capName, "%q is not a valid node name", node)
		}
	}
	for _, s := range c.Stages {
		if !codec.ValidName(s) {
			return bad("Stages", "%q is not a valid stage name", s)
		}
	}
	return nil
}

// redactURL returns u (one URL or a list) with its passwords replaced by
// "xxxxx".
func redactURL(u string) string { return redact.URL(u) }

// CheckDedupe validates the idempotency policy of stage.
func CheckDedupe(stage string, p DedupePolicy) error {
	switch {
	case names.Stage(stage) != nil:
		return fmt.Errorf("stage %q: %v", stage, names.Stage(stage))
	case p.Window < time.Second || p.Window > maxDedupeWindow:
		return fmt.Errorf("stage %s: window %s is out of range 1s..%s", stage, p.Window, maxDedupeWindow)
	case p.MaxEntries < 1 || p.MaxEntries > maxDedupeEntries:
		return fmt.Errorf("stage %s: max entries %d is out of range 1..%d", stage, p.MaxEntries, maxDedupeEntries)
	}
	return nil
}

// Bounds of a stage's idempotency policy.
const (
	maxDedupeWindow  = 90 * 24 * time.Hour
	maxDedupeEntries = 10_000_000
)

// CheckRetry validates the retry policy of stage.
func CheckRetry(stage string, p RetryPolicy) error {
	switch {
	case names.Stage(stage) != nil:
		return fmt.Errorf("stage %q: %v", stage, names.Stage(stage))
	case p.Attempts < 1 || p.Attempts > maxRetryAttempts:
		return fmt.Errorf("stage %s: attempts %d is out of range 1..%d", stage, p.Attempts, maxRetryAttempts)
	case p.Backoff < minRetryBackoff || p.Backoff > maxRetryBackoff:
		return fmt.Errorf("stage %s: backoff %s is out of range %s..%s", stage, p.Backoff, minRetryBackoff, maxRetryBackoff)
	case p.MaxBackoff != 0 && (p.MaxBackoff < p.Backoff || p.MaxBackoff > maxRetryBackoff):
		return fmt.Errorf("stage %s: max backoff %s is out of range %s (backoff)..%s", stage, p.MaxBackoff, p.Backoff, maxRetryBackoff)
	}
	return nil
}

// Bounds of a stage's retry policy.
const (
	maxRetryAttempts = codec.MaxRetryAttempts
	minRetryBackoff  = 10 * time.Millisecond
	maxRetryBackoff  = 7 * 24 * time.Hour
)
