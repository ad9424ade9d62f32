package meshtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	// rabbitReadyTimeout bounds a broker start (first start and restarts),
	// from its start slot (rabbit_slots.go) until it answers. A member
	// joining a cluster on a loaded 2-core machine was still enabling its
	// feature flags, table by table with its peers, after a minute, and
	// had not opened its port at two.
	rabbitReadyTimeout = 3 * time.Minute
	// rabbitStopTimeout bounds a graceful broker stop.
	rabbitStopTimeout = 60 * time.Second
)

// Rabbit is a RabbitMQ broker run by the harness: its own node name, data
// directory and loopback ports, kept across Stop/Kill and Start. The user
// guest (password guest) may use every vhost. Methods must be called from
// the test goroutine.
type Rabbit struct {
	dir      string // instance dir, owned by the broker's user
	node     string // Erlang node name
	port     int    // AMQP
	mgmtPort int    // management HTTP API
	distPort int    // Erlang distribution
	tlsPort  int    // AMQPS; 0 unless made by NewRabbitMQTLS
	tls      bool   // listen for AMQPS too (certificates in dir)
	acc      *account

	mu   sync.Mutex
	proc *child // nil while stopped
}

var rabbitSeq atomic.Int64

// NewRabbitMQ starts a private broker for tb (for fault tests) and stops it
// and removes its data in tb's Cleanup.
func NewRabbitMQ(tb testing.TB) *Rabbit {
	tb.Helper()
	return newPrivateRabbit(tb, false)
}

// newPrivateRabbit is NewRabbitMQ, with an AMQPS listener if withTLS.
func newPrivateRabbit(tb testing.TB, withTLS bool) *Rabbit {
	tb.Helper()
	start := time.Now()
	r, err := newRabbit(withTLS)
	if err != nil {
		tb.Fatalf("meshtest: start RabbitMQ: %v", err)
	}
	tb.Logf("meshtest: RabbitMQ %s ready on %s in %v", r.node, r.URL(), time.Since(start).Round(time.Millisecond))
	tb.Cleanup(func() {
		if tb.Failed() {
			// What the broker saw is the evidence of a failure at a
			// distance (connections closed by it, an alarm, a crash).
			tb.Logf("meshtest: RabbitMQ %s (running: %v) after the failure, its log's end:\n%s", r.node, r.running(), tailFile(r.logPath(), 80))
		}
		if err := r.destroy(); err != nil {
			tb.Errorf("meshtest: stop RabbitMQ: %v", err)
		}
	})
	return r
}

// shared holds the services shared by the tests of one test process; each
// has its own lock so that one's slow start does not hold up the other.
var shared struct {
	rabbitMu  sync.Mutex
	rabbit    *Rabbit
	rabbitE   error  // first start failed: every caller fails with it
	rabbitLog string // how the start went, logged by the first caller

	pgMu  sync.Mutex
	pg    *PG
	pgE   error
	pgLog string

	tlsMu sync.Mutex // the broker with TLS (RabbitMQTLS)
	tls   *Rabbit
	tlsE  error
}

// RabbitMQ returns the broker shared by the tests of this package, starting
// it on first use, or as Main starts when Main names it early. Main stops
// it. If it failed to start, every caller fails with the same error.
func RabbitMQ(tb testing.TB) *Rabbit {
	tb.Helper()
	shared.rabbitMu.Lock()
	defer shared.rabbitMu.Unlock()
	startSharedRabbit()
	if shared.rabbitLog != "" {
		tb.Log(shared.rabbitLog)
		shared.rabbitLog = ""
	}
	if shared.rabbitE != nil {
		tb.Fatalf("meshtest: shared RabbitMQ failed to start: %v", shared.rabbitE)
	}
	return shared.rabbit
}

// startSharedRabbit starts the shared broker unless it was started (or
// failed to) before; shared.rabbitMu is held.
func startSharedRabbit() {
	if shared.rabbit != nil || shared.rabbitE != nil {
		return
	}
	start := time.Now()
	r, err := newRabbit(false)
	if err != nil {
		shared.rabbitE = err
		return
	}
	shared.rabbit = r
	shared.rabbitLog = fmt.Sprintf("meshtest: shared RabbitMQ %s ready on %s in %v", r.node, r.URL(), time.Since(start).Round(time.Millisecond))
}

// URL returns the AMQP URL of the default vhost.
func (r *Rabbit) URL() string {
	return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", r.port)
}

// Port returns the AMQP port.
func (r *Rabbit) Port() int { return r.port }

// ManagementURL returns the base URL of the management HTTP API (user
// guest, password guest).
func (r *Rabbit) ManagementURL() string {
	return fmt.Sprintf("http://127.0.0.1:%d", r.mgmtPort)
}

// AdminURL returns the management API's base URL with the administrator's
// credential in it (http://guest:guest@127.0.0.1:port), the form meshbox's
// --broker-admin flag takes. guest is an administrator of every vhost.
func (r *Rabbit) AdminURL() string {
	return fmt.Sprintf("http://guest:guest@127.0.0.1:%d", r.mgmtPort)
}

// AMQPAddr returns the broker's AMQP URL for vhost (path-escaped by this
// function) without a credential: what the broker.url setting holds.
func (r *Rabbit) AMQPAddr(vhost string) string {
	return fmt.Sprintf("amqp://127.0.0.1:%d/%s", r.port, url.PathEscape(vhost))
}

// Node returns the broker's Erlang node name.
func (r *Rabbit) Node() string { return r.node }

// Vhost creates a fresh vhost named after the test, grants guest full
// permissions on it, and returns its AMQP URL. The vhost is deleted in tb's
// Cleanup (if the broker is running then).
func (r *Rabbit) Vhost(tb testing.TB) string {
	tb.Helper()
	name := uniqueName(tb.Name(), '-', 100)
	path := "/api/vhosts/" + url.PathEscape(name)
	if err := r.api(http.MethodPut, path, map[string]any{}); err != nil {
		tb.Fatalf("meshtest: create vhost %s: %v", name, err)
	}
	perm := map[string]string{"configure": ".*", "write": ".*", "read": ".*"}
	if err := r.api(http.MethodPut, "/api/permissions/"+url.PathEscape(name)+"/guest", perm); err != nil {
		tb.Fatalf("meshtest: grant guest on vhost %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if !r.running() {
			return
		}
		if err := r.api(http.MethodDelete, path, nil); err != nil {
			tb.Errorf("meshtest: delete vhost %s: %v", name, err)
		}
	})
	return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/%s", r.port, url.PathEscape(name))
}

// Stop stops the broker gracefully and waits for it to exit. Its ports and
// data are kept for Start.
func (r *Rabbit) Stop(tb testing.TB) {
	tb.Helper()
	start := time.Now()
	if err := r.stop(); err != nil {
		tb.Fatalf("meshtest: stop RabbitMQ: %v", err)
	}
	tb.Logf("meshtest: RabbitMQ stopped in %v", time.Since(start).Round(time.Millisecond))
}

// Kill kills the broker's Erlang VM with SIGKILL and waits for it to be gone.
func (r *Rabbit) Kill(tb testing.TB) {
	tb.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		tb.Fatalf("meshtest: kill RabbitMQ: not running")
	}
	start := time.Now()
	r.proc.killGroup()
	r.proc = nil
	tb.Logf("meshtest: RabbitMQ killed in %v", time.Since(start).Round(time.Millisecond))
}

// Start starts the broker again after Stop or Kill, on the same ports and
// with the same data, and waits until it accepts connections.
func (r *Rabbit) Start(tb testing.TB) {
	tb.Helper()
	start := time.Now()
	if err := r.start(); err != nil {
		tb.Fatalf("meshtest: start RabbitMQ: %v", err)
	}
	tb.Logf("meshtest: RabbitMQ %s restarted in %v", r.node, time.Since(start).Round(time.Millisecond))
}

// rabbitScript finds the broker's start script. Distribution packages put a
// wrapper on PATH that may redirect output or change directory, so the
// script of the RabbitMQ release itself is preferred.
func rabbitScript() (string, error) {
	if p := os.Getenv("MESHTEST_RABBITMQ_SERVER"); p != "" {
		return p, nil
	}
	candidates := []string{"/usr/lib/rabbitmq/bin/rabbitmq-server"}
	if matches, _ := filepath.Glob("/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin/rabbitmq-server"); len(matches) > 0 {
		candidates = append(candidates, matches[len(matches)-1])
	}
	for _, c := range candidates {
		if fi, err := os.Stat(c); err == nil && fi.Mode()&0o111 != 0 {
			return c, nil
		}
	}
	if p, err := exec.LookPath("rabbitmq-server"); err == nil {
		return p, nil
	}
	return "", errors.New("rabbitmq-server not found (run testing/services.sh, or set MESHTEST_RABBITMQ_SERVER)")
}

// newRabbit starts a broker in a fresh instance dir; withTLS adds an AMQPS
// listener with a test CA (see NewRabbitMQTLS).
func newRabbit(withTLS bool) (*Rabbit, error) {
	r, err := prepareRabbit(withTLS, "")
	if err != nil {
		return nil, err
	}
	if err := r.startFresh(); err != nil {
		os.RemoveAll(r.dir)
		return nil, err
	}
	return r, nil
}

// prepareRabbit makes a broker's instance dir and name without starting
// it. A non-empty cookie is written as the Erlang cookie (the nodes of a
// cluster share one); otherwise the VM makes its own.
func prepareRabbit(withTLS bool, cookie string) (*Rabbit, error) {
	acc, err := serviceAccount("rabbitmq")
	if err != nil {
		return nil, err
	}
	dir, err := instanceDir("rabbitmq", acc)
	if err != nil {
		return nil, err
	}
	r := &Rabbit{
		dir:  dir,
		node: fmt.Sprintf("meshtest-%d-%d@localhost", os.Getpid(), rabbitSeq.Add(1)),
		tls:  withTLS,
		acc:  acc,
	}
	if withTLS {
		if err := writeTLSFiles(dir, acc); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if cookie != "" {
		// HOME is the instance dir: the VM and rabbitmqctl read it there.
		if err := writeOwned(filepath.Join(dir, ".erlang.cookie"), []byte(cookie), acc); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	return r, nil
}

// startFresh chooses the ports and starts a prepared broker. Free ports can
// be taken by another test process between choosing and binding them: it
// retries with new ones.
func (r *Rabbit) startFresh() error {
	for attempt := 1; ; attempt++ {
		err := r.choosePorts()
		if err != nil {
			return err
		}
		err = r.start()
		if err == nil || attempt == 3 || !errors.Is(err, errPortInUse) {
			return err
		}
	}
}

var errPortInUse = errors.New("port in use")

func (r *Rabbit) choosePorts() error {
	var err error
	if r.port, err = freePort(); err != nil {
		return err
	}
	if r.mgmtPort, err = freePort(); err != nil {
		return err
	}
	if r.distPort, err = freePort(); err != nil {
		return err
	}
	if r.tls {
		if r.tlsPort, err = freePort(); err != nil {
			return err
		}
	}
	conf := fmt.Sprintf(`listeners.tcp.1 = 127.0.0.1:%d
management.tcp.ip = 127.0.0.1
management.tcp.port = %d
log.console = true
log.console.level = info
log.console.use_colors = off
log.file = false
disk_free_limit.absolute = 50MB
vm_memory_high_watermark.relative = 0.6
`, r.port, r.mgmtPort) + r.tlsConf()
	if err := writeOwned(filepath.Join(r.dir, "rabbitmq.conf"), []byte(conf), r.acc); err != nil {
		return err
	}
	plugins := "[rabbitmq_management].\n"
	if r.tls { // client certificates log in with SASL EXTERNAL
		plugins = "[rabbitmq_management,rabbitmq_auth_mechanism_ssl].\n"
	}
	if err := writeOwned(filepath.Join(r.dir, "enabled_plugins"), []byte(plugins), r.acc); err != nil {
		return err
	}
	return writeOwned(filepath.Join(r.dir, "rabbitmq-env.conf"), nil, r.acc)
}

func (r *Rabbit) logPath() string { return filepath.Join(r.dir, "console.log") }

func (r *Rabbit) running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc != nil && !r.proc.exited()
}

// start starts the broker process and waits until AMQP and the management
// API answer.
func (r *Rabbit) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		return errors.New("already running")
	}
	script, err := rabbitScript()
	if err != nil {
		return err
	}
	env := cleanEnv([]string{"RABBITMQ_", "HOME=", "ERL_", "NOTIFY_SOCKET="},
		"HOME="+r.dir,
		"RABBITMQ_NODENAME="+r.node,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(r.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(r.distPort),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(r.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(r.dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(r.dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(r.dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(r.dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(r.dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(r.dir, "rabbitmq.pid"),
		// The start script then execs the VM instead of waiting on it, so
		// the child is the VM itself; -noinput keeps the shell off.
		"RABBITMQ_ALLOW_INPUT=1",
		// Busy-waiting schedulers burn CPU that other brokers and tests on
		// a small machine need.
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-noinput +sbwt none +sbwtdcpu none +sbwtdio none",
	)
	release, waited, err := startSlot()
	if err != nil {
		return err
	}
	defer release()
	proc, err := startChild(script, nil, r.dir, env, r.acc, r.logPath())
	if err != nil {
		return err
	}
	if err := r.waitReady(proc); err != nil {
		if waited > time.Second {
			err = fmt.Errorf("%w (after %v waiting for another broker's boot)", err, waited.Round(time.Millisecond))
		}
		proc.killGroup()
		log := tailFile(r.logPath(), 60)
		if strings.Contains(log, "eaddrinuse") {
			err = fmt.Errorf("%w: %w", errPortInUse, err)
		}
		return fmt.Errorf("%w\n--- broker log (%s) ---\n%s", err, r.logPath(), log)
	}
	r.proc = proc
	return nil
}

func (r *Rabbit) waitReady(proc *child) error {
	deadline := time.Now().Add(rabbitReadyTimeout)
	var last error
	for {
		if proc.exited() {
			return fmt.Errorf("broker exited during start-up: %v", proc.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("broker not ready after %v: %v", rabbitReadyTimeout, last)
		}
		last = r.probe()
		if last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// probe checks that the management API answers and an AMQP connection can
// be opened.
func (r *Rabbit) probe() error {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", r.port), time.Second)
	if err != nil {
		return err
	}
	c.Close()
	if r.tlsPort != 0 {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", r.tlsPort), time.Second)
		if err != nil {
			return fmt.Errorf("TLS listener: %w", err)
		}
		c.Close()
	}
	if err := r.api(http.MethodGet, "/api/overview", nil); err != nil {
		return err
	}
	conn, err := amqp.DialConfig(r.URL(), amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		return err
	}
	return conn.Close()
}

// stop stops the broker with SIGTERM (a graceful shutdown) and waits.
func (r *Rabbit) stop() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return errors.New("not running")
	}
	proc := r.proc
	r.proc = nil
	proc.signal(syscall.SIGTERM)
	if !proc.wait(rabbitStopTimeout) {
		proc.killGroup()
		return fmt.Errorf("broker did not stop within %v; killed\n--- broker log ---\n%s", rabbitStopTimeout, tailFile(r.logPath(), 60))
	}
	// Helpers of the VM (erl_child_setup) go with it.
	proc.killGroup()
	return nil
}

// destroy kills the broker if it runs (its data is thrown away, so a graceful
// stop would only cost time) and removes its directory.
func (r *Rabbit) destroy() error {
	r.mu.Lock()
	if r.proc != nil {
		r.proc.killGroup()
		r.proc = nil
	}
	r.mu.Unlock()
	return os.RemoveAll(r.dir)
}

// mgmtClient talks to management APIs without keeping idle connections, so
// no transport goroutine outlives a call.
var mgmtClient = &http.Client{
	Timeout:   10 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

// api calls the management API as guest. A non-nil body is sent as JSON.
func (r *Rabbit) api(method, path string, body any) error {
	return r.apiInto(method, path, body, nil)
}

// apiInto is api decoding the answer's JSON into out (unless nil).
func (r *Rabbit) apiInto(method, path string, body, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.ManagementURL()+path, rd)
	if err != nil {
		return err
	}
	req.SetBasicAuth("guest", "guest")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := mgmtClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(msg)))
	}
	if out != nil {
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out); err != nil {
			return fmt.Errorf("%s %s: decode: %w", method, path, err)
		}
	}
	return nil
}

// NoCredential returns an AMQP URL without its user and password: the form
// the broker.url mesh setting takes (a node then connects with its own
// credential, or, on a harness broker, with amqp091's default guest).
func NoCredential(amqpURL string) string {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return amqpURL
	}
	u.User = nil
	return u.String()
}
