package doctor

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/cache"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Outcomes of a check.
const (
	OK   = "ok"
	Warn = "warn"
	Fail = "fail"
)

// Clock skew thresholds against the mesh database.
const (
	skewWarn = 2 * time.Second
	skewFail = time.Minute
)

// DefaultHostsFile is the hosts file doctor looks for a pinned public name in.
const DefaultHostsFile = "/etc/hosts"

// settingBrokerURL is the mesh setting that says where the broker is.
const settingBrokerURL = "broker.url"

// Check is the outcome of one check.
type Check struct {
	Name    string `json:"name"`
	Status  string `json:"status"` // ok, warn or fail
	Message string `json:"message"`
	Hint    string `json:"hint,omitempty"`
}

// Report is every check's outcome: what `meshbox doctor --json` prints.
type Report struct {
	Node   string  `json:"node"`
	Data   string  `json:"data"`
	Checks []Check `json:"checks"`
	OK     int     `json:"ok"`
	Warn   int     `json:"warn"`
	Fail   int     `json:"fail"`
}

// Options say what to check.
type Options struct {
	// Config is the node's configuration, as appliance.LoadConfig built it.
	Config appliance.Config
	// Server is the NATS URL of the running node (for messages).
	Server string
	// Status asks the running node for its status; nil: no node is asked.
	Status func(ctx context.Context) (appliance.Status, error)
	// HostsFile is where to look for a pinned public name (DefaultHostsFile).
	HostsFile string
	// PublicName is this node's public name; empty: from the bindings.
	PublicName string
	// Timeout bounds each network check.
	Timeout time.Duration
	// EnvFile is the env file the configuration was read from ("" for
	// none), and Environ the environment (KEY=VALUE): their MESHBOX_*
	// names are checked.
	EnvFile string
	Environ []string
}

// Doctor runs the checks in order; later checks use what earlier ones
// learned (the node's status, the cached bindings, the database's clock).
// A Doctor runs once, on one goroutine.
type Doctor struct {
	cfg        appliance.Config
	server     string
	askStatus  func(ctx context.Context) (appliance.Status, error)
	hostsFile  string
	publicName string
	timeout    time.Duration
	envFile    string
	environ    []string
	now        func() time.Time

	status *appliance.Status // the running node's status, nil when it did not answer
	snap   *cache.Snapshot   // the cached bindings, nil when not read
	dbSkew *time.Duration    // database clock minus ours, nil when not measured
	dbRTT  time.Duration
	dbErr  error

	brokerConn *amqp.Connection // opened by checkBroker, closed by checkCredential
}

// New returns a doctor for opts.
func New(opts Options) *Doctor {
	d := &Doctor{
		cfg:        opts.Config,
		server:     opts.Server,
		askStatus:  opts.Status,
		hostsFile:  opts.HostsFile,
		publicName: opts.PublicName,
		timeout:    opts.Timeout,
		envFile:    opts.EnvFile,
		environ:    opts.Environ,
		now:        time.Now,
	}
	if d.hostsFile == "" {
		d.hostsFile = DefaultHostsFile
	}
	if d.timeout <= 0 {
		d.timeout = 3 * time.Second
	}
	return d
}

// Run runs every check and returns their outcomes.
func (d *Doctor) Run(ctx context.Context) Report {
	checks := []func(context.Context) Check{
		d.checkVariables,
		d.checkDataDir,
		d.checkDataFiles,
		d.checkNode,
		d.checkCache,
		d.checkDatabase,
		d.checkBroker,
		d.checkCredential,
		d.checkTransport,
		d.checkClock,
		d.checkMeshNames,
		d.checkHostsFile,
		d.checkNATSBind,
		d.checkModules,
		d.checkNATSAccess,
	}
	rep := Report{Node: d.cfg.Node, Data: d.cfg.DataDir}
	for _, run := range checks {
		c := run(ctx)
		switch c.Status {
		case OK:
			rep.OK++
		case Warn:
			rep.Warn++
		default:
			rep.Fail++
		}
		rep.Checks = append(rep.Checks, c)
	}
	return rep
}

// WriteText writes one line per check, its hint indented below.
func (rep Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "meshbox doctor: node %s, data %s\n\n", rep.Node, rep.Data)
	width := 0
	for _, c := range rep.Checks {
		width = max(width, len(c.Name))
	}
	for _, c := range rep.Checks {
		label := map[string]string{OK: "ok", Warn: "WARN", Fail: "FAIL"}[c.Status]
		fmt.Fprintf(w, "  %-4s  %-*s  %s\n", label, width, c.Name, c.Message)
		if c.Hint != "" {
			fmt.Fprintf(w, "  %-4s  %-*s  hint: %s\n", "", width, "", c.Hint)
		}
	}
	fmt.Fprintf(w, "\n%d checks: %d ok, %d warnings, %d failed\n", len(rep.Checks), rep.OK, rep.Warn, rep.Fail)
}

func ok(name, format string, args ...any) Check {
	return Check{Name: name, Status: OK, Message: fmt.Sprintf(format, args...)}
}

func warn(name, hint, format string, args ...any) Check {
	return Check{Name: name, Status: Warn, Message: fmt.Sprintf(format, args...), Hint: hint}
}

func fail(name, hint, format string, args ...any) Check {
	return Check{Name: name, Status: Fail, Message: fmt.Sprintf(format, args...), Hint: hint}
}
