package doctor

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/cache"
)

func TestFindInHosts(t *testing.T) {
	hosts := `# The following lines are desirable for IPv6 capable hosts
127.0.0.1	localhost
127.0.1.1	attic.example.org attic
::1     localhost ip6-localhost ip6-loopback
10.0.0.7 Garage.Example.Org.   # pinned by hand
# 10.0.0.8 cellar.example.org
`
	tests := []struct {
		name  string
		lines []int
	}{
		{"attic.example.org", []int{3}},
		{"attic", []int{3}},
		{"garage.example.org", []int{5}},
		{"GARAGE.example.org.", []int{5}},
		{"cellar.example.org", nil}, // commented out
		{"example.org", nil},
		{"localhost", []int{2, 4}},
	}
	for _, tt := range tests {
		got, err := findInHosts(strings.NewReader(hosts), tt.name)
		if err != nil {
			t.Fatal(err)
		}
		var lines []int
		for _, e := range got {
			lines = append(lines, e.Line)
		}
		if fmt.Sprint(lines) != fmt.Sprint(tt.lines) {
			t.Errorf("findInHosts(%q): got lines %v, want %v", tt.name, lines, tt.lines)
		}
	}
}

func TestMulticastName(t *testing.T) {
	tests := []struct {
		host string
		want bool
	}{
		{"broker.local", true},
		{"Broker.LOCAL.", true},
		{"local", true},
		{"broker.localdomain", false},
		{"broker.local.example.org", false},
		{"broker.example.org", false},
		{"127.0.0.1", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := multicastName(tt.host); got != tt.want {
			t.Errorf("multicastName(%q): got %v, want %v", tt.host, got, tt.want)
		}
	}
}

func TestLoopbackAddrs(t *testing.T) {
	tests := []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:4222", true},
		{"127.0.0.53:4222", true},
		{"[::1]:4222", true},
		{"localhost:4222", true},
		{"0.0.0.0:4222", false},
		{":4222", false},
		{"[::]:4222", false},
		{"192.168.1.5:4222", false},
		{"attic:4222", false},
		{"nonsense", false},
	}
	for _, tt := range tests {
		if got := appliance.LoopbackAddr(tt.addr); got != tt.want {
			t.Errorf("LoopbackAddr(%q): got %v, want %v", tt.addr, got, tt.want)
		}
	}
	if got := ConnectAddr("0.0.0.0:4222"); got != "127.0.0.1:4222" {
		t.Errorf("ConnectAddr(0.0.0.0:4222): got %q, want 127.0.0.1:4222", got)
	}
}

// newDoctor returns a doctor for a node "attic" in dir that reaches no
// running node.
func newDoctor(t *testing.T, dir string) *Doctor {
	t.Helper()
	cfg := appliance.DefaultConfig()
	cfg.Node = "attic"
	cfg.DataDir = dir
	return New(Options{Config: cfg, Server: "nats://127.0.0.1:1", HostsFile: filepath.Join(t.TempDir(), "hosts"), Timeout: time.Second})
}

func TestDoctorDataDirPermissions(t *testing.T) {
	// Tests may run as root, for whom nothing is unreadable: the check looks
	// at the mode bits and the owner, not at whether access fails.
	tests := []struct {
		name      string
		dirMode   os.FileMode
		cacheMode os.FileMode // 0: no cache.db
		dir, file string      // wanted status of each check
	}{
		{"private", 0o700, 0o600, OK, OK},
		{"no files yet", 0o700, 0, OK, OK},
		{"world readable dir", 0o755, 0o600, Fail, OK},
		{"group writable dir", 0o770, 0o600, Fail, OK},
		{"readable cache file", 0o700, 0o644, OK, Fail},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if tt.cacheMode != 0 {
				if err := os.WriteFile(filepath.Join(dir, "cache.db"), nil, tt.cacheMode); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(filepath.Join(dir, "cache.db"), tt.cacheMode); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Chmod(dir, tt.dirMode); err != nil {
				t.Fatal(err)
			}
			d := newDoctor(t, dir)
			if c := d.checkDataDir(context.Background()); c.Status != tt.dir {
				t.Errorf("data directory: got %s (%s), want %s", c.Status, c.Message, tt.dir)
			} else if c.Status == Fail && !strings.Contains(c.Hint, "chmod 700") {
				t.Errorf("data directory hint: got %q, want chmod 700", c.Hint)
			}
			if c := d.checkDataFiles(context.Background()); c.Status != tt.file {
				t.Errorf("data files: got %s (%s), want %s", c.Status, c.Message, tt.file)
			} else if c.Status == Fail && !strings.Contains(c.Hint, "chmod 600") {
				t.Errorf("data files hint: got %q, want chmod 600", c.Hint)
			}
		})
	}

	d := newDoctor(t, filepath.Join(t.TempDir(), "missing"))
	if c := d.checkDataDir(context.Background()); c.Status != Warn {
		t.Errorf("missing data directory: got %s (%s), want warn", c.Status, c.Message)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	d = newDoctor(t, file)
	if c := d.checkDataDir(context.Background()); c.Status != Fail {
		t.Errorf("data directory that is a file: got %s (%s), want fail", c.Status, c.Message)
	}
}

func TestCheckPrivateOwner(t *testing.T) {
	path := t.TempDir()
	if err := os.Chmod(path, 0o700); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	owner := fileOwner(fi)
	if c := checkPrivate("x", path, fi, owner, ""); c.Status != OK {
		t.Errorf("own directory: got %s (%s), want ok", c.Status, c.Message)
	}
	if c := checkPrivate("x", path, fi, owner+12345, ""); c.Status != Fail {
		t.Errorf("someone else's directory: got %s (%s), want fail", c.Status, c.Message)
	}
	if owner != 0 {
		if c := checkPrivate("x", path, fi, 0, ""); c.Status != OK {
			t.Errorf("root looking at a service user's directory: got %s (%s), want ok", c.Status, c.Message)
		}
	}
}

// putSnapshot writes a snapshot for node attic into dir/cache.db.
func putSnapshot(t *testing.T, dir string, fetched time.Time, b cache.Bindings) {
	t.Helper()
	s, err := cache.Open(filepath.Join(dir, "cache.db"), cache.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Put(cache.NewSnapshot(7, fetched, "postgres://db/mesh", b)); err != nil {
		t.Fatal(err)
	}
}

func TestDoctorCacheAndNames(t *testing.T) {
	dir := t.TempDir()
	b := cache.Bindings{
		Node:     "attic",
		Nodes:    []cache.NodeRecord{{Name: "attic", PublicName: "attic.example.org"}, {Name: "garage"}},
		Settings: map[string]string{"broker.url": "amqp://attic:pw@broker.local:5672/mesh", "forge.url": "https://forge.example.org"},
	}
	putSnapshot(t, dir, time.Now().Add(-time.Hour), b)

	d := newDoctor(t, dir)
	d.cfg.Cache.MaxAge = appliance.Duration(24 * time.Hour)
	if c := d.checkCache(context.Background()); c.Status != OK || !strings.Contains(c.Message, "revision 7") {
		t.Errorf("fresh cache: got %s (%s), want ok with revision 7", c.Status, c.Message)
	}
	if u, from := d.brokerURL(); u != b.Settings["broker.url"] || from != "the cached bindings" {
		t.Errorf("broker URL: got %q from %q, want the cached setting", appliance.RedactURL(u), from)
	}
	c := d.checkMeshNames(context.Background())
	if c.Status != Fail || !strings.Contains(c.Message, "setting broker.url host broker.local") {
		t.Errorf("mesh names: got %s (%s), want fail naming broker.url", c.Status, c.Message)
	}
	if strings.Contains(c.Message, "forge") {
		t.Errorf("mesh names: %q blames forge.example.org, which is fine", c.Message)
	}

	// The public name comes from the node record; pinned in the hosts file = fail.
	if c := d.checkHostsFile(context.Background()); c.Status != OK {
		t.Errorf("no hosts file: got %s (%s), want ok", c.Status, c.Message)
	}
	if err := os.WriteFile(d.hostsFile, []byte("127.0.0.1 localhost\n10.1.1.1 garage.example.org\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c := d.checkHostsFile(context.Background()); c.Status != OK {
		t.Errorf("other names pinned: got %s (%s), want ok", c.Status, c.Message)
	}
	if err := os.WriteFile(d.hostsFile, []byte("127.0.0.1 localhost\n127.0.1.1 attic.example.org attic\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c := d.checkHostsFile(context.Background()); c.Status != Fail || !strings.Contains(c.Message, "line 2: 127.0.1.1") {
		t.Errorf("own public name pinned: got %s (%s), want fail naming line 2", c.Status, c.Message)
	}

	// Old bindings are a warning.
	dir2 := t.TempDir()
	putSnapshot(t, dir2, time.Now().Add(-48*time.Hour), b)
	d2 := newDoctor(t, dir2)
	d2.cfg.Cache.MaxAge = appliance.Duration(24 * time.Hour)
	if c := d2.checkCache(context.Background()); c.Status != Warn || !strings.Contains(c.Message, "older than cache.max_age") {
		t.Errorf("old cache: got %s (%s), want warn older than max_age", c.Status, c.Message)
	}

	// A held file with no node answering is a warning, not a hang.
	s, err := cache.Open(filepath.Join(dir, "cache.db"), cache.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d3 := newDoctor(t, dir)
	start := time.Now()
	if c := d3.checkCache(context.Background()); c.Status != Warn || !strings.Contains(c.Message, "in use") {
		t.Errorf("held cache: got %s (%s), want warn in use", c.Status, c.Message)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("held cache: took %s, want a short lock timeout", el)
	}
	// With the node's status: judged from it.
	d3.status = &appliance.Status{Bindings: cache.Status{Source: "cache", Revision: 7, AgeSeconds: 3600}}
	if c := d3.checkCache(context.Background()); c.Status != Warn || !strings.Contains(c.Message, "runs from its cache") {
		t.Errorf("node on cache: got %s (%s), want warn runs from its cache", c.Status, c.Message)
	}
	d3.status = &appliance.Status{Bindings: cache.Status{Source: "db", Revision: 7}}
	if c := d3.checkCache(context.Background()); c.Status != OK {
		t.Errorf("node on db: got %s (%s), want ok", c.Status, c.Message)
	}
}

func TestDoctorNATSBind(t *testing.T) {
	d := newDoctor(t, t.TempDir())
	d.cfg.NATS = "0.0.0.0:4222"
	if c := d.checkNATSBind(context.Background()); c.Status != Fail {
		t.Errorf("configured 0.0.0.0: got %s (%s), want fail", c.Status, c.Message)
	}
	d.cfg.NATS = "127.0.0.1:4222"
	d.status = &appliance.Status{NATS: appliance.NATSStatus{URL: "nats://[::]:4222"}}
	if c := d.checkNATSBind(context.Background()); c.Status != Fail {
		t.Errorf("node reports [::]: got %s (%s), want fail", c.Status, c.Message)
	}

	// Something listening on every address on the configured port is found
	// by dialing this machine's other addresses (when it has any).
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // exits when ln is closed
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	d.status = nil
	d.cfg.NATS = "127.0.0.1:" + port
	want := OK
	if hasOtherAddress(t) {
		want = Fail
	}
	if c := d.checkNATSBind(context.Background()); c.Status != want {
		t.Errorf("port open on all addresses: got %s (%s), want %s", c.Status, c.Message, want)
	}
	loop, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer loop.Close()
	d.cfg.NATS = loop.Addr().String()
	if c := d.checkNATSBind(context.Background()); c.Status != OK {
		t.Errorf("loopback only: got %s (%s), want ok", c.Status, c.Message)
	}
}

func hasOtherAddress(t *testing.T) bool {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
			return true
		}
	}
	return false
}

func TestCheckTransport(t *testing.T) {
	for _, tt := range []struct {
		broker, db string
		want       string
		msg        string
	}{
		{"", "", OK, "standalone"},
		{"amqps://broker.example.org/mesh", "postgres://u@db.example.org/mesh?sslmode=verify-full", OK, "encrypted"},
		{"amqp://127.0.0.1:5672/", "postgres://u@localhost/mesh", OK, "encrypted or stay"},
		{"amqp://broker.example.org/mesh", "", Fail, "not encrypted (amqp://)"},
		{"", "postgres://u@db.example.org/mesh?sslmode=require", Fail, "sslmode require"},
		{"", "postgres://u@db.example.org/mesh", Fail, "prefer (the default)"},
		{"", "postgres:///mesh?host=/run/postgresql", OK, "encrypted or stay"},
	} {
		d := New(Options{Config: appliance.Config{Broker: appliance.Secret(tt.broker), DB: appliance.Secret(tt.db)}})
		c := d.checkTransport(context.Background())
		if c.Status != tt.want || !strings.Contains(c.Message, tt.msg) {
			t.Errorf("broker %q db %q: got %s %q, want %s with %q", tt.broker, tt.db, c.Status, c.Message, tt.want, tt.msg)
		}
	}
}

func TestCheckNATSAccess(t *testing.T) {
	for _, tt := range []struct {
		name   string
		cfg    appliance.Config
		status *appliance.Status
		want   string
	}{
		{"standalone", appliance.Config{}, nil, Warn},
		{"mesh", appliance.Config{DB: "postgres://h/db"}, nil, OK},
		{"mesh, anonymous allowed", appliance.Config{DB: "postgres://h/db", NATSAnonymous: true}, nil, Warn},
		{"the running node says open", appliance.Config{DB: "postgres://h/db"}, &appliance.Status{NATS: appliance.NATSStatus{Auth: appliance.AuthOpen}}, Warn},
		{"the running node says credentials", appliance.Config{}, &appliance.Status{NATS: appliance.NATSStatus{Auth: appliance.AuthCredentials}}, OK},
	} {
		d := New(Options{Config: tt.cfg})
		d.status = tt.status
		if c := d.checkNATSAccess(context.Background()); c.Status != tt.want {
			t.Errorf("%s: got %s (%s), want %s", tt.name, c.Status, c.Message, tt.want)
		}
	}
}
