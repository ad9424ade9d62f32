package meshtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// pgReadyTimeout bounds a server start.
	pgReadyTimeout = 60 * time.Second
	// pgStopTimeout bounds a fast shutdown.
	pgStopTimeout = 30 * time.Second
)

// PG is a PostgreSQL server run by the harness: its own data directory and
// loopback port, kept across Stop/Kill and Start. The superuser postgres
// connects without a password over loopback; every other role needs its
// password (scram-sha-256). Methods must be called from
// the test goroutine.
type PG struct {
	dir  string // instance dir, owned by the server's user
	bin  string // directory of initdb and postgres
	port int
	acc  *account

	mu   sync.Mutex
	proc *child // nil while stopped
}

// NewPostgres starts a private server for tb (for fault tests) and stops it
// and removes its data in tb's Cleanup.
func NewPostgres(tb testing.TB) *PG {
	tb.Helper()
	start := time.Now()
	p, err := newPG()
	if err != nil {
		tb.Fatalf("meshtest: start PostgreSQL: %v", err)
	}
	tb.Logf("meshtest: PostgreSQL ready on port %d in %v", p.port, time.Since(start).Round(time.Millisecond))
	tb.Cleanup(func() {
		if err := p.destroy(); err != nil {
			tb.Errorf("meshtest: stop PostgreSQL: %v", err)
		}
	})
	return p
}

// Postgres returns the server shared by the tests of this package, starting
// it on first use, or as Main starts when Main names it early. Main stops
// it. If it failed to start, every caller fails with the same error.
func Postgres(tb testing.TB) *PG {
	tb.Helper()
	shared.pgMu.Lock()
	defer shared.pgMu.Unlock()
	startSharedPG()
	if shared.pgLog != "" {
		tb.Log(shared.pgLog)
		shared.pgLog = ""
	}
	if shared.pgE != nil {
		tb.Fatalf("meshtest: shared PostgreSQL failed to start: %v", shared.pgE)
	}
	return shared.pg
}

// startSharedPG starts the shared server unless it was started (or
// failed to) before; shared.pgMu is held.
func startSharedPG() {
	if shared.pg != nil || shared.pgE != nil {
		return
	}
	start := time.Now()
	shared.pg, shared.pgE = newPG()
	if shared.pgE == nil {
		shared.pgLog = fmt.Sprintf("meshtest: shared PostgreSQL ready on port %d in %v", shared.pg.port, time.Since(start).Round(time.Millisecond))
	}
}

// Port returns the server's TCP port on 127.0.0.1.
func (p *PG) Port() int { return p.port }

// URL returns the URL of database name as superuser postgres.
func (p *PG) URL(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.port, name)
}

// Database creates a fresh database named after the test and returns its
// URL. The database is dropped in tb's Cleanup (if the server is running
// then), even while clients are still connected.
func (p *PG) Database(tb testing.TB) string {
	tb.Helper()
	name := uniqueName(tb.Name(), '_', 63)
	if err := p.exec("CREATE DATABASE " + pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("meshtest: create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if !p.running() {
			return
		}
		if err := p.exec("DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize() + " WITH (FORCE)"); err != nil {
			tb.Errorf("meshtest: drop database %s: %v", name, err)
		}
	})
	return p.URL(name)
}

// Stop shuts the server down (fast mode: clients are disconnected) and
// waits for it to exit. Its port and data are kept for Start.
func (p *PG) Stop(tb testing.TB) {
	tb.Helper()
	start := time.Now()
	if err := p.stop(); err != nil {
		tb.Fatalf("meshtest: stop PostgreSQL: %v", err)
	}
	tb.Logf("meshtest: PostgreSQL stopped in %v", time.Since(start).Round(time.Millisecond))
}

// Kill kills the server and all its backends with SIGKILL, as a crash would;
// the next Start runs crash recovery.
func (p *PG) Kill(tb testing.TB) {
	tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc == nil {
		tb.Fatalf("meshtest: kill PostgreSQL: not running")
	}
	start := time.Now()
	shm := pgShmID(p.dataDir())
	p.proc.killGroup()
	p.proc = nil
	if !waitShmDetached(shm, 15*time.Second) {
		tb.Fatalf("meshtest: kill PostgreSQL: its shared memory segment %d is still attached after 15s", shm)
	}
	tb.Logf("meshtest: PostgreSQL killed in %v", time.Since(start).Round(time.Millisecond))
}

// Start starts the server again after Stop or Kill, on the same port and
// with the same data, and waits until it accepts connections.
func (p *PG) Start(tb testing.TB) {
	tb.Helper()
	start := time.Now()
	if err := p.start(); err != nil {
		tb.Fatalf("meshtest: start PostgreSQL: %v", err)
	}
	tb.Logf("meshtest: PostgreSQL restarted in %v", time.Since(start).Round(time.Millisecond))
}

// pgBinDir finds the directory holding initdb and postgres: the newest
// version under the usual distribution layout, else the directory of
// initdb on PATH.
func pgBinDir() (string, error) {
	if d := os.Getenv("MESHTEST_PG_BIN"); d != "" {
		return d, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool { return pgVersion(matches[i]) < pgVersion(matches[j]) })
	for i := len(matches) - 1; i >= 0; i-- {
		dir := filepath.Dir(matches[i])
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("PostgreSQL server binaries (initdb, postgres) not found (run testing/services.sh, or set MESHTEST_PG_BIN)")
}

// pgVersion extracts the major version from .../postgresql/<v>/bin/initdb.
func pgVersion(path string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(filepath.Dir(path))), 64)
	return v
}

func newPG() (*PG, error) {
	bin, err := pgBinDir()
	if err != nil {
		return nil, err
	}
	acc, err := serviceAccount("postgres")
	if err != nil {
		return nil, err
	}
	dir, err := instanceDir("postgres", acc)
	if err != nil {
		return nil, err
	}
	p := &PG{dir: dir, bin: bin, acc: acc}
	if err := p.initdb(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		if p.port, err = freePort(); err != nil {
			break
		}
		err = p.start()
		if err == nil {
			return p, nil
		}
		if attempt == 3 || !errors.Is(err, errPortInUse) {
			break
		}
	}
	os.RemoveAll(dir)
	return nil, err
}

func (p *PG) dataDir() string { return filepath.Join(p.dir, "data") }
func (p *PG) logPath() string { return filepath.Join(p.dir, "server.log") }

func (p *PG) env() []string {
	return cleanEnv([]string{"PG", "HOME=", "LC_", "LANG="}, "HOME="+p.dir, "LANG=C")
}

func (p *PG) initdb() error {
	initLog := filepath.Join(p.dir, "initdb.log")
	proc, err := startChild(filepath.Join(p.bin, "initdb"),
		[]string{"-D", p.dataDir(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"},
		p.dir, p.env(), p.acc, initLog)
	if err != nil {
		return fmt.Errorf("initdb: %w", err)
	}
	if !proc.wait(pgReadyTimeout) {
		proc.killGroup()
		return fmt.Errorf("initdb did not finish within %v", pgReadyTimeout)
	}
	if proc.err != nil {
		return fmt.Errorf("initdb: %v\n--- initdb log ---\n%s", proc.err, tailFile(initLog, 40))
	}
	return writeOwned(filepath.Join(p.dataDir(), "pg_hba.conf"), []byte(pgHBA), p.acc)
}

// pgHBA lets the superuser postgres in without a password over loopback and
// makes every other role (the mesh's node roles) give its password, so
// tests of per-node roles see the same authentication as a real server.
const pgHBA = `local all postgres trust
host  all postgres 127.0.0.1/32 trust
local all all scram-sha-256
host  all all 127.0.0.1/32 scram-sha-256
`

func (p *PG) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proc != nil && !p.proc.exited()
}

// start runs the postmaster as a direct child (not through pg_ctl, which
// detaches it) so that it dies with the test process.
func (p *PG) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc != nil {
		return errors.New("already running")
	}
	args := []string{
		"-D", p.dataDir(),
		"-c", "port=" + strconv.Itoa(p.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + p.dir,
		"-c", "max_connections=200",
		"-c", "shared_buffers=32MB",
		"-c", "logging_collector=off",
		// No fsync: what a test kills is the server's process, never the
		// machine, and the kernel keeps what the process wrote. Every
		// commit and CREATE DATABASE otherwise waits on the disk.
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
	}
	proc, err := startChild(filepath.Join(p.bin, "postgres"), args, p.dir, p.env(), p.acc, p.logPath())
	if err != nil {
		return err
	}
	if err := p.waitReady(proc); err != nil {
		proc.killGroup()
		log := tailFile(p.logPath(), 40)
		if strings.Contains(log, "Address already in use") {
			err = fmt.Errorf("%w: %w", errPortInUse, err)
		}
		return fmt.Errorf("%w\n--- server log (%s) ---\n%s", err, p.logPath(), log)
	}
	p.proc = proc
	return nil
}

func (p *PG) waitReady(proc *child) error {
	deadline := time.Now().Add(pgReadyTimeout)
	var last error
	for {
		if proc.exited() {
			return fmt.Errorf("server exited during start-up: %v", proc.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("server not ready after %v: %v", pgReadyTimeout, last)
		}
		if last = p.exec("SELECT 1"); last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// exec runs one statement in database postgres on a fresh connection.
func (p *PG) exec(sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(p.URL("postgres"))
	if err != nil {
		return err
	}
	cfg.ConnectTimeout = 2 * time.Second
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// stop shuts the server down in fast mode (SIGINT) and waits.
func (p *PG) stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc == nil {
		return errors.New("not running")
	}
	proc := p.proc
	p.proc = nil
	proc.signal(syscall.SIGINT)
	if !proc.wait(pgStopTimeout) {
		proc.killGroup()
		return fmt.Errorf("server did not stop within %v; killed\n--- server log ---\n%s", pgStopTimeout, tailFile(p.logPath(), 40))
	}
	return nil
}

// destroy kills the server if it runs (its data is thrown away, so a graceful
// stop would only cost time) and removes its directory.
func (p *PG) destroy() error {
	p.mu.Lock()
	if p.proc != nil {
		p.proc.killGroup()
		p.proc = nil
	}
	p.mu.Unlock()
	return os.RemoveAll(p.dir)
}

// Dump runs the server's own pg_dump on the database at dsn with args
// (say --data-only, or --table NAME) and returns the dump's SQL text.
func (p *PG) Dump(tb testing.TB, dsn string, args ...string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin, "pg_dump"), append([]string{"--dbname", dsn}, args...)...)
	cmd.Env = p.env()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		tb.Fatalf("meshtest: pg_dump: %v\n%s", err, errOut.String())
	}
	return out.String()
}

// Exec runs one SQL statement on the server as superuser postgres, as an
// operator's psql would (a statement such as CREATE DATABASE cannot run
// inside a transaction).
func (p *PG) Exec(tb testing.TB, sql string) {
	tb.Helper()
	if err := p.exec(sql); err != nil {
		tb.Fatalf("meshtest: %s: %v", sql, err)
	}
}

// ExecContext runs one SQL statement as superuser postgres and returns its
// error (for cleanups that must not fail a test).
func (p *PG) ExecContext(ctx context.Context, sql string) error {
	_ = ctx
	return p.exec(sql)
}
