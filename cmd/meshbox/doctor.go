package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/cache"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Outcomes of a doctor check.
const (
	checkOK   = "ok"
	checkWarn = "warn"
	checkFail = "fail"
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

// Check is the outcome of one doctor check.
type Check struct {
	Name    string `json:"name"`
	Status  string `json:"status"` // ok, warn or fail
	Message string `json:"message"`
	Hint    string `json:"hint,omitempty"`
}

// DoctorReport is what `meshbox doctor --json` prints.
type DoctorReport struct {
	Node   string  `json:"node"`
	Data   string  `json:"data"`
	Checks []Check `json:"checks"`
	OK     int     `json:"ok"`
	Warn   int     `json:"warn"`
	Fail   int     `json:"fail"`
}

// DoctorCommand checks the situation of a node — its data directory, the
// mesh database, the broker, the cached bindings, clocks, names — and says
// what is wrong and what to do about it.
type DoctorCommand struct{ m *Main }

// Run runs every check, prints them, and fails when any check failed.
func (c *DoctorCommand) Run(ctx context.Context, args []string) error {
	d, asJSON, err := c.parse(args)
	if err != nil {
		return err
	}
	rep := d.run(ctx)
	if asJSON {
		enc := json.NewEncoder(c.m.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printReport(c.m.Stdout, rep)
	}
	if rep.Fail > 0 {
		return &exitError{code: 1, msg: fmt.Sprintf("doctor: %d of %d checks failed", rep.Fail, len(rep.Checks))}
	}
	return nil
}

// parse builds the doctor from the same configuration a node would run
// with (defaults, config file, environment file, environment, flags) and
// doctor's own flags.
func (c *DoctorCommand) parse(args []string) (*doctor, bool, error) {
	cfg := appliance.DefaultConfig()
	fset := c.m.newFlagSet("doctor", "doctor [--db URL] [--broker URL] [--data DIR] [--nats HOST:PORT] [--server URL] [--json]")
	configFile := fset.String("config", "", "JSON config file of the node (env MESHBOX_CONFIG)")
	envFile := fset.String("env-file", "", "read MESHBOX_* variables from this file first, e.g. /etc/meshbox/meshbox.env")
	flags := []struct{ name, field, help string }{
		{"node", "node", "the node's mesh name (env MESHBOX_NODE; default: the host name)"},
		{"data", "data", "the node's data directory (env MESHBOX_DATA; default " + cfg.DataDir + ")"},
		{"nats", "nats", "the node's NATS listen address (env MESHBOX_NATS; default " + appliance.DefaultNATS + ")"},
		{"db", "db", "mesh database URL (env MESHBOX_DB)"},
		{"broker", "broker", "broker URL (env MESHBOX_BROKER; default: the broker.url setting of the cached bindings)"},
	}
	vals := map[string]*string{}
	for _, f := range flags {
		vals[f.name] = fset.String(f.name, "", f.help)
	}
	server := fset.String("server", c.m.Getenv("MESHBOX_SERVER"), "NATS URL to ask the running node (env MESHBOX_SERVER; default: from --nats)")
	hosts := fset.String("hosts", DefaultHostsFile, "hosts file to look for this node's pinned public name")
	publicName := fset.String("public-name", "", "this node's public name (default: from the bindings)")
	timeout := fset.Duration("timeout", 3*time.Second, "time allowed for each network check")
	asJSON := fset.Bool("json", false, "print the checks as JSON")
	if err := parseFlags(fset, args); err != nil {
		return nil, false, err
	}
	if fset.NArg() > 0 {
		return nil, false, usagef("doctor takes no arguments, got %q", fset.Arg(0))
	}
	if *timeout <= 0 {
		return nil, false, usagef("--timeout: must be positive, got %s", *timeout)
	}
	if *configFile == "" {
		*configFile = c.m.Getenv("MESHBOX_CONFIG")
	}
	if *configFile != "" {
		if err := cfg.LoadFile(*configFile); err != nil {
			return nil, false, err
		}
	}
	if *envFile != "" {
		env, err := readEnvFile(*envFile)
		if err != nil {
			return nil, false, err
		}
		if err := cfg.ApplyEnv(func(k string) string { return env[k] }); err != nil {
			return nil, false, fmt.Errorf("%s: %w", *envFile, err)
		}
	}
	if err := cfg.ApplyEnv(c.m.Getenv); err != nil {
		return nil, false, err
	}
	var setErr error
	fset.Visit(func(f *flag.Flag) {
		if _, ok := vals[f.Name]; !ok {
			return
		}
		for _, d := range flags {
			if d.name == f.Name {
				if err := cfg.Set(d.field, f.Value.String()); err != nil && setErr == nil {
					setErr = err
				}
			}
		}
	})
	if setErr != nil {
		return nil, false, setErr
	}
	if err := cfg.Validate(); err != nil {
		return nil, false, err
	}
	d := &doctor{
		cfg:        cfg,
		server:     *server,
		hostsFile:  *hosts,
		publicName: *publicName,
		timeout:    *timeout,
		now:        time.Now,
	}
	if d.server == "" {
		d.server = "nats://" + loopbackAddr(cfg.NATS)
	}
	return d, *asJSON, nil
}

// readEnvFile reads KEY=VALUE lines (the subset of systemd's
// EnvironmentFile syntax that meshbox.env uses: comments, blank lines,
// optional quotes).
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("env file: %w", err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("env file %s: line %d: not KEY=VALUE", path, n)
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		env[strings.TrimSpace(k)] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("env file %s: %w", path, err)
	}
	return env, nil
}

// loopbackAddr turns a listen address into one to connect to: an
// unspecified host (0.0.0.0, ::, "") becomes 127.0.0.1.
func loopbackAddr(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// doctor runs the checks in order; later checks use what earlier ones
// learned (the node's status, the cached bindings, the database's clock).
type doctor struct {
	cfg        appliance.Config
	server     string
	hostsFile  string
	publicName string
	timeout    time.Duration
	now        func() time.Time

	status    map[string]any // the running node's status, nil when it did not answer
	statusErr error
	snap      *cache.Snapshot // the cached bindings, nil when not read
	dbSkew    *time.Duration  // database clock minus ours, nil when not measured
	dbRTT     time.Duration
	dbErr     error
}

func (d *doctor) run(ctx context.Context) DoctorReport {
	checks := []func(context.Context) Check{
		d.checkDataDir,
		d.checkDataFiles,
		d.checkNode,
		d.checkCache,
		d.checkDatabase,
		d.checkBroker,
		d.checkClock,
		d.checkMeshNames,
		d.checkHostsFile,
		d.checkNATSBind,
	}
	rep := DoctorReport{Node: d.cfg.Node, Data: d.cfg.DataDir}
	for _, run := range checks {
		c := run(ctx)
		switch c.Status {
		case checkOK:
			rep.OK++
		case checkWarn:
			rep.Warn++
		default:
			rep.Fail++
		}
		rep.Checks = append(rep.Checks, c)
	}
	return rep
}

// printReport writes one line per check, its hint indented below.
func printReport(w io.Writer, rep DoctorReport) {
	fmt.Fprintf(w, "meshbox doctor: node %s, data %s\n\n", rep.Node, rep.Data)
	width := 0
	for _, c := range rep.Checks {
		width = max(width, len(c.Name))
	}
	for _, c := range rep.Checks {
		label := map[string]string{checkOK: "ok", checkWarn: "WARN", checkFail: "FAIL"}[c.Status]
		fmt.Fprintf(w, "  %-4s  %-*s  %s\n", label, width, c.Name, c.Message)
		if c.Hint != "" {
			fmt.Fprintf(w, "  %-4s  %-*s  hint: %s\n", "", width, "", c.Hint)
		}
	}
	fmt.Fprintf(w, "\n%d checks: %d ok, %d warnings, %d failed\n", len(rep.Checks), rep.OK, rep.Warn, rep.Fail)
}

func ok(name, format string, args ...any) Check {
	return Check{Name: name, Status: checkOK, Message: fmt.Sprintf(format, args...)}
}

func warn(name, hint, format string, args ...any) Check {
	return Check{Name: name, Status: checkWarn, Message: fmt.Sprintf(format, args...), Hint: hint}
}

func fail(name, hint, format string, args ...any) Check {
	return Check{Name: name, Status: checkFail, Message: fmt.Sprintf(format, args...), Hint: hint}
}

// fileOwner returns the uid owning fi (-1 where the platform does not say).
func fileOwner(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

// checkDataDir: the data directory exists, is a directory, is private
// (no group or other bits: it holds grant credentials) and belongs to the
// user that runs the node.
func (d *doctor) checkDataDir(context.Context) Check {
	const name = "data directory"
	dir := d.cfg.DataDir
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return warn(name, "meshbox run creates it (mode 0700); pass --data if the node uses another directory",
			"%s does not exist yet", dir)
	case err != nil:
		return fail(name, "", "%s: %v", dir, err)
	case !fi.IsDir():
		return fail(name, "point --data (MESHBOX_DATA) at a directory", "%s is not a directory", dir)
	}
	return checkPrivate(name, dir, fi, os.Geteuid(), "chmod 700 "+dir)
}

// checkPrivate checks that fi has no group or other permission bits and is
// owned by euid (root may look at anyone's).
func checkPrivate(name, path string, fi fs.FileInfo, euid int, fix string) Check {
	perm := fi.Mode().Perm()
	owner := fileOwner(fi)
	if perm&0o077 != 0 {
		return fail(name, fix, "%s has mode %#o: other users can read or change it (it holds the mesh's credentials)", path, perm)
	}
	if owner >= 0 && owner != euid {
		if euid == 0 {
			return ok(name, "%s: mode %#o, owned by uid %d (the service user)", path, perm, owner)
		}
		return fail(name, fmt.Sprintf("run doctor as the user that runs meshbox, or chown -R %d %s", euid, path),
			"%s is owned by uid %d, not by this user (uid %d)", path, owner, euid)
	}
	return ok(name, "%s: mode %#o, owned by uid %d", path, perm, owner)
}

// checkDataFiles: the cache and outbox files are private (0600) and owned
// like their directory.
func (d *doctor) checkDataFiles(context.Context) Check {
	const name = "data files"
	dirInfo, err := os.Stat(d.cfg.DataDir)
	if err != nil || !dirInfo.IsDir() {
		return ok(name, "no data directory, no files to check")
	}
	var found []string
	for _, f := range []string{"cache.db", "outbox.db"} {
		path := filepath.Join(d.cfg.DataDir, f)
		fi, err := os.Stat(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fail(name, "", "%s: %v", path, err)
		}
		if !fi.Mode().IsRegular() {
			return fail(name, "move it away; the node creates the file", "%s is not a regular file", path)
		}
		if perm := fi.Mode().Perm(); perm&0o077 != 0 {
			return fail(name, "chmod 600 "+path, "%s has mode %#o: other users can read it", path, perm)
		}
		if o, do := fileOwner(fi), fileOwner(dirInfo); o != do {
			return fail(name, fmt.Sprintf("chown %d %s", do, path), "%s is owned by uid %d, its directory by uid %d", path, o, do)
		}
		found = append(found, f)
	}
	if len(found) == 0 {
		return ok(name, "none yet")
	}
	return ok(name, "%s: mode 0600", strings.Join(found, ", "))
}

// checkNode asks the running node for its status on its NATS API.
func (d *doctor) checkNode(ctx context.Context) Check {
	const name = "node"
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	st, _, err := nodeStatus(ctx, d.server)
	if err != nil {
		d.statusErr = err
		return warn(name, "start it (systemctl start meshbox, or meshbox run); pass --server if it listens elsewhere",
			"no node answers at %s", appliance.RedactURL(d.server))
	}
	d.status = st
	msg := fmt.Sprintf("%v is running meshbox %v at %s", st["node"], st["version"], appliance.RedactURL(d.server))
	if bs := str(get(st, "broker", "state")); bs != "" {
		msg += ", broker " + bs
	}
	if n := str(st["node"]); n != "" && n != d.cfg.Node {
		return warn(name, "pass --node (or MESHBOX_NODE) as the node runs with", "%s; it is not %q, the node this configuration names", msg, d.cfg.Node)
	}
	return ok(name, "%s", msg)
}

// checkCache reads the cached bindings, or, while the node runs and holds
// the file, asks the node how old its bindings are.
func (d *doctor) checkCache(context.Context) Check {
	const name = "bindings cache"
	path := filepath.Join(d.cfg.DataDir, "cache.db")
	maxAge := d.cfg.Cache.MaxAge.D()
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		if d.cfg.DB == "" {
			return ok(name, "no cache file: a standalone node needs none")
		}
		return warn(name, "start the node once while the database is reachable",
			"no cache file at %s: if the database is away when the node starts, it starts without bindings", path)
	}
	store, err := cache.Open(path, cache.StoreOptions{ReadOnly: true, LockTimeout: 300 * time.Millisecond})
	if errors.Is(err, cache.ErrLocked) {
		return d.cacheFromNode(name, maxAge)
	}
	if errors.Is(err, cache.ErrCorrupt) {
		return fail(name, "the node sets a damaged file aside and rebuilds it from the database when it starts", "%s is damaged: %v", path, err)
	}
	if err != nil {
		return fail(name, "", "%s: %v", path, err)
	}
	defer store.Close()
	snap, err := store.Latest()
	if errors.Is(err, cache.ErrNoSnapshot) {
		if d.cfg.DB == "" {
			return ok(name, "empty: a standalone node needs none")
		}
		return warn(name, "start the node once while the database is reachable", "%s holds no bindings yet", path)
	}
	if err != nil {
		return fail(name, "", "%s: %v", path, err)
	}
	d.snap = &snap
	age := d.now().Sub(snap.FetchedAt).Round(time.Second)
	msg := fmt.Sprintf("revision %d for node %s, fetched %s ago from %s", snap.Revision, snap.Bindings.Node, age, snap.Source)
	if snap.Bindings.Node != d.cfg.Node {
		return warn(name, "pass --node as the node runs with", "%s: the cache is for another node than %q", msg, d.cfg.Node)
	}
	if maxAge > 0 && age > maxAge {
		return warn(name, "the node refreshes them once the database answers; check the database check below",
			"%s: older than cache.max_age (%s)", msg, maxAge)
	}
	return ok(name, "%s", msg)
}

// cacheFromNode judges the bindings from the running node's status.
func (d *doctor) cacheFromNode(name string, maxAge time.Duration) Check {
	if d.status == nil {
		return warn(name, "another meshbox process holds the data directory; pass --server to reach it",
			"the cache file is in use, and no node answers at %s", appliance.RedactURL(d.server))
	}
	src := str(get(d.status, "bindings", "source"))
	msg := "the running node holds the cache"
	age, hasAge := get(d.status, "bindings", "age_seconds").(float64)
	if src != cache.SourceNone {
		msg = "the running node holds the cache; its bindings come from " + src
		if rev := get(d.status, "bindings", "revision"); rev != nil {
			msg += fmt.Sprintf(", revision %v", rev)
		}
		if hasAge {
			msg += ", age " + (time.Duration(age) * time.Second).String()
		}
	}
	if src == cache.SourceNone && d.cfg.DB == "" {
		return ok(name, "%s: it has no bindings, and a standalone node needs none", msg)
	}
	if w := str(get(d.status, "bindings", "warning")); w != "" {
		return warn(name, "see the bindings part of meshbox status", "%s: %s", msg, w)
	}
	if src == cache.SourceCache {
		return warn(name, "the node returns to the database by itself once it answers; check the database check below",
			"%s: the node runs from its cache, the mesh database does not answer it", msg)
	}
	if src == cache.SourceNone {
		return warn(name, "see the bindings part of meshbox status", "%s: it has no bindings", msg)
	}
	if hasAge && maxAge > 0 && time.Duration(age)*time.Second > maxAge {
		return warn(name, "", "%s: older than cache.max_age (%s)", msg, maxAge)
	}
	return ok(name, "%s", msg)
}

// checkDatabase connects to the mesh database with short timeouts and
// reads its clock.
func (d *doctor) checkDatabase(ctx context.Context) Check {
	const name = "database"
	if d.cfg.DB == "" {
		return ok(name, "none configured: the node runs standalone")
	}
	safe := d.cfg.DB.String()
	pc, err := pgx.ParseConfig(string(d.cfg.DB))
	if err != nil {
		return fail(name, "fix --db (MESHBOX_DB)", "%s is not a usable database URL", safe)
	}
	pc.ConnectTimeout = d.timeout
	ctx, cancel := context.WithTimeout(ctx, d.timeout+time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, pc)
	if err != nil {
		d.dbErr = err
		return fail(name, dbHint(err), "cannot connect to %s: %s", safe, dbError(err))
	}
	defer conn.Close(context.Background())
	var dbNow time.Time
	var version string
	t0 := time.Now()
	err = conn.QueryRow(ctx, "SELECT now(), current_setting('server_version')").Scan(&dbNow, &version)
	t1 := time.Now()
	if err != nil {
		d.dbErr = err
		return fail(name, dbHint(err), "%s answers but a query failed: %s", safe, dbError(err))
	}
	d.dbRTT = t1.Sub(t0)
	skew := dbNow.Sub(t0.Add(d.dbRTT / 2))
	d.dbSkew = &skew
	return ok(name, "%s reachable (PostgreSQL %s, %s round trip)", safe, version, d.dbRTT.Round(time.Millisecond))
}

// dbError is a pgx error without the connection details it repeats.
func dbError(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Message + " (SQLSTATE " + pe.Code + ")"
	}
	var ce *pgconn.ConnectError
	msg := err.Error()
	if errors.As(err, &ce) && ce.Unwrap() != nil {
		msg = ce.Unwrap().Error()
	}
	// pgx joins the errors of each attempt (TLS, then plain) by lines.
	first, _, _ := strings.Cut(msg, "\n")
	return first
}

func dbHint(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "28P01", "28000":
			return "the database refused the user or password in --db (MESHBOX_DB)"
		case "3D000":
			return "the database named in --db does not exist; meshbox init creates a mesh database"
		}
	}
	if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return "no answer in time: is the host reachable from here (firewall, VPN)?"
	}
	return "is PostgreSQL running and listening on that host and port, and is it reachable from here?"
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// brokerURL is the broker the node would use: the configured one, else the
// broker.url setting of the cached bindings. from says which.
func (d *doctor) brokerURL() (u, from string) {
	if d.cfg.Broker != "" {
		return string(d.cfg.Broker), "configuration"
	}
	if d.snap != nil {
		if v := d.snap.Bindings.Settings[settingBrokerURL]; v != "" {
			return v, "the cached bindings"
		}
	}
	return "", ""
}

// checkBroker dials the broker with a short timeout: reachable, and the
// credentials and vhost accepted.
func (d *doctor) checkBroker(context.Context) Check {
	const name = "broker"
	raw, from := d.brokerURL()
	if raw == "" {
		if d.status != nil {
			if s := str(get(d.status, "broker", "state")); s != "" && s != "none" {
				return ok(name, "not checked here (URL not known to doctor): the node reports the link %s; pass --broker to check it", s)
			}
		}
		if d.cfg.DB != "" {
			return warn(name, "pass --broker, or let the node cache its bindings once", "broker URL not known: no --broker and no cached broker.url setting")
		}
		return ok(name, "none configured: the node runs standalone")
	}
	safe := appliance.RedactURL(raw)
	cfg := amqp.Config{
		Dial:       amqp.DefaultDial(d.timeout),
		Heartbeat:  10 * time.Second,
		Properties: amqp.NewConnectionProperties(),
	}
	cfg.Properties.SetClientConnectionName("meshbox doctor " + d.cfg.Node)
	if d.cfg.Bridge.CAFile != "" {
		pem, err := os.ReadFile(d.cfg.Bridge.CAFile)
		if err != nil {
			return fail(name, "fix bridge.ca_file", "read CA file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fail(name, "fix bridge.ca_file", "%s holds no PEM certificate", d.cfg.Bridge.CAFile)
		}
		cfg.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	conn, err := amqp.DialConfig(raw, cfg)
	if err != nil {
		var ae *amqp.Error
		switch {
		case errors.As(err, &ae) && ae.Code == amqp.AccessRefused:
			return fail(name, "the broker refused the user or password in the broker URL; check the node's broker credentials",
				"%s (from %s): credentials refused: %s", safe, from, ae.Reason)
		case errors.As(err, &ae) && ae.Code == amqp.NotAllowed:
			return fail(name, "the user may not use this vhost (or a connection limit is reached); check the broker's permissions",
				"%s (from %s): access refused: %s", safe, from, ae.Reason)
		case isTimeout(err):
			return fail(name, "no answer in time: is the host reachable from here (firewall, VPN)?", "%s (from %s): %v", safe, from, err)
		default:
			return fail(name, "is RabbitMQ running and listening on that host and port, and reachable from here?",
				"%s (from %s): cannot connect: %v", safe, from, err)
		}
	}
	defer conn.Close()
	product, _ := conn.Properties["product"].(string)
	version, _ := conn.Properties["version"].(string)
	return ok(name, "%s (from %s) reachable, credentials accepted (%s %s)", safe, from, product, version)
}

// checkClock compares our clock with the mesh database's. AMQP does not
// carry the broker's time, so the broker is not measured.
func (d *doctor) checkClock(context.Context) Check {
	const name = "clock"
	if d.dbSkew == nil {
		if d.cfg.DB == "" {
			return ok(name, "not measured: no database configured (the broker does not tell its time over AMQP)")
		}
		return warn(name, "see the database check", "not measured: the database did not answer")
	}
	skew := *d.dbSkew
	abs := skew
	if abs < 0 {
		abs = -abs
	}
	// What we cannot resolve is half the round trip.
	abs -= d.dbRTT / 2
	dir := "ahead of"
	if skew > 0 {
		dir = "behind"
	}
	msg := fmt.Sprintf("this machine is %s %s the database's clock (round trip %s)", skew.Abs().Round(time.Millisecond), dir, d.dbRTT.Round(time.Millisecond))
	switch {
	case abs > skewFail:
		return fail(name, "run a time sync service (systemd-timesyncd, chrony) on this machine and on the database host", "%s", msg)
	case abs > skewWarn:
		return warn(name, "run a time sync service (systemd-timesyncd, chrony); ages and deadlines depend on clocks", "%s", msg)
	}
	return ok(name, "%s", msg)
}

// multicastName reports whether host is a multicast DNS name (.local).
func multicastName(host string) bool {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	return h == "local" || strings.HasSuffix(h, ".local")
}

// urlHost returns the host name of a URL ("" when it has none).
func urlHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// checkMeshNames flags multicast DNS names (.local) for the database, the
// broker and any URL in the mesh settings: they resolve only on one LAN and
// only where mDNS works, a known cause of "works on one node only".
func (d *doctor) checkMeshNames(context.Context) Check {
	const name = "mesh names"
	type named struct{ what, host string }
	var hosts []named
	if d.cfg.DB != "" {
		hosts = append(hosts, named{"database", urlHost(string(d.cfg.DB))})
	}
	if d.cfg.Broker != "" {
		hosts = append(hosts, named{"broker", urlHost(string(d.cfg.Broker))})
	}
	if d.snap != nil {
		keys := make([]string, 0, len(d.snap.Bindings.Settings))
		for k := range d.snap.Bindings.Settings {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if h := urlHost(d.snap.Bindings.Settings[k]); h != "" {
				hosts = append(hosts, named{"setting " + k, h})
			}
		}
	}
	var bad []string
	for _, h := range hosts {
		if multicastName(h.host) {
			bad = append(bad, fmt.Sprintf("%s host %s", h.what, h.host))
		}
	}
	if len(bad) > 0 {
		return fail(name, "use names every node resolves the same way: the overlay (VPN) name or a DNS name, not mDNS",
			"%s: multicast DNS (.local) names resolve only on one network, so other nodes cannot reach them", strings.Join(bad, ", "))
	}
	if len(hosts) == 0 {
		return ok(name, "no database or broker names to check")
	}
	var list []string
	for _, h := range hosts {
		list = append(list, h.host)
	}
	return ok(name, "no multicast (.local) names: %s", strings.Join(dedupe(list), ", "))
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// hostsEntry is one name on one line of a hosts file.
type hostsEntry struct {
	Line    int
	Address string
}

// findInHosts returns the lines of a hosts file (r) that map name.
func findInHosts(r io.Reader, name string) ([]hostsEntry, error) {
	want := strings.TrimSuffix(strings.ToLower(name), ".")
	var out []hostsEntry
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		for _, f := range fields[1:] {
			if strings.TrimSuffix(strings.ToLower(f), ".") == want {
				out = append(out, hostsEntry{Line: n, Address: fields[0]})
				break
			}
		}
	}
	return out, sc.Err()
}

// checkHostsFile: this node's public name must not be pinned in the local
// hosts file. A pinned name (Debian maps the host's own name to 127.0.1.1)
// makes the node resolve itself differently from everyone else.
func (d *doctor) checkHostsFile(context.Context) Check {
	const name = "hosts file"
	public, from := d.publicName, "--public-name"
	if public == "" && d.snap != nil {
		if rec, ok := d.snap.Bindings.NodeRecord(d.cfg.Node); ok && rec.PublicName != "" {
			public, from = rec.PublicName, "the node record"
		}
	}
	if public == "" {
		if d.snap == nil {
			return ok(name, "public name not known (no cached bindings); pass --public-name to check it")
		}
		return ok(name, "node %s has no public name", d.cfg.Node)
	}
	f, err := os.Open(d.hostsFile)
	if errors.Is(err, fs.ErrNotExist) {
		return ok(name, "no hosts file at %s", d.hostsFile)
	}
	if err != nil {
		return warn(name, "", "%s: %v", d.hostsFile, err)
	}
	defer f.Close()
	found, err := findInHosts(f, public)
	if err != nil {
		return warn(name, "", "%s: %v", d.hostsFile, err)
	}
	if len(found) > 0 {
		var where []string
		for _, e := range found {
			where = append(where, fmt.Sprintf("line %d: %s", e.Line, e.Address))
		}
		return fail(name, fmt.Sprintf("remove %s from %s; let DNS answer for it like it does for every other node", public, d.hostsFile),
			"this node's public name %s (from %s) is pinned in %s (%s)", public, from, d.hostsFile, strings.Join(where, ", "))
	}
	return ok(name, "this node's public name %s is not pinned in %s", public, d.hostsFile)
}

// checkNATSBind: the local NATS server is for programs on this machine; it
// must listen on loopback only. Checks the configured address, the address
// the running node reports, and whether the port answers on this machine's
// other addresses.
func (d *doctor) checkNATSBind(ctx context.Context) Check {
	const name = "local NATS"
	hint := "listen on loopback only: --nats 127.0.0.1:4222 (MESHBOX_NATS)"
	addrs := []string{d.cfg.NATS}
	if d.status != nil {
		if pu, err := url.Parse(str(get(d.status, "nats", "url"))); err == nil && pu.Host != "" {
			addrs = append(addrs, pu.Host)
		}
	}
	for _, a := range addrs {
		if !loopbackListen(a) {
			return fail(name, hint, "NATS listens on %s, which other machines can reach", a)
		}
	}
	port := ""
	for _, a := range addrs {
		if _, p, err := net.SplitHostPort(a); err == nil && p != "0" {
			port = p
		}
	}
	if port != "" {
		if open := answersOffLoopback(ctx, port, 300*time.Millisecond); len(open) > 0 {
			return fail(name, hint, "port %s answers on %s, not only on loopback", port, strings.Join(open, ", "))
		}
	}
	return ok(name, "listens on loopback only (%s)", strings.Join(dedupe(addrs), ", "))
}

// loopbackListen reports whether a listen address host:port is loopback.
func loopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// answersOffLoopback dials port on every non-loopback address of this
// machine and returns those that accept a connection.
func answersOffLoopback(ctx context.Context, port string, timeout time.Duration) []string {
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var open []string
	dialer := net.Dialer{Timeout: timeout}
	for _, a := range ifaddrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLoopback() || ipn.IP.IsLinkLocalUnicast() {
			continue
		}
		target := net.JoinHostPort(ipn.IP.String(), port)
		c, err := dialer.DialContext(ctx, "tcp", target)
		if err == nil {
			_ = c.Close()
			open = append(open, ipn.IP.String())
		}
	}
	return open
}
