package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/ledger"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
)

// requirePeers turns on the peer check of TestStatusPageInBrowser: the
// second node must appear as a peer of the first on the rendered page.
// Peers the status reports are always checked on the page; this makes their
// absence a failure. (On since node discovery fills status.peers.)
const requirePeers = true

// screenshotEnv names the environment variable that makes
// TestStatusPageInBrowser write the README's screenshot (docs/status-page.png)
// instead of a temporary file: MESHBOX_UPDATE_SCREENSHOT=1 go test -run StatusPageInBrowser ./testing/e2e/
const screenshotEnv = "MESHBOX_UPDATE_SCREENSHOT"

// chromiumPath returns Debian's chromium. Installing it is the job of
// `make test` (its services step, testing/services.sh), never of a test: a
// missing browser fails the test with the command that installs it.
func chromiumPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium is not installed (%v): run `make services` (testing/services.sh) first", err)
	}
	return p
}

// chromium runs a headless chromium on pageURL with a fresh profile, no
// background networking, and args; it returns standard output.
func chromium(t *testing.T, pageURL string, args ...string) string {
	t.Helper()
	bin := chromiumPath(t)
	profile := t.TempDir()
	full := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-default-apps", "--disable-extensions", "--no-default-browser-check",
		"--user-data-dir=" + profile, "--virtual-time-budget=5000",
	}
	full = append(full, args...)
	full = append(full, pageURL)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, full...)
	cmd.Env = append(os.Environ(), "HOME="+profile, "XDG_CONFIG_HOME="+profile, "XDG_CACHE_HOME="+profile)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// On timeout the whole process group goes: chromium starts helpers.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // helpers left behind, if any
	}
	if err != nil {
		t.Fatalf("chromium %s: %v\n%s", pageURL, err, tail(stderr.String(), 20))
	}
	return stdout.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// renderedPage is the DOM of the status page after its scripts ran.
type renderedPage struct{ dom string }

// renderPage loads the page at pageURL in the browser and returns its DOM.
func renderPage(t *testing.T, pageURL string) renderedPage {
	t.Helper()
	dom := chromium(t, pageURL, "--dump-dom")
	if !strings.Contains(dom, `id="mesh-svg"`) {
		t.Fatalf("the browser did not render the status page:\n%s", tail(dom, 30))
	}
	return renderedPage{dom: dom}
}

// text returns the text of the element with id (elements with text only).
func (p renderedPage) text(t *testing.T, id string) string {
	t.Helper()
	m := regexp.MustCompile(`id="` + regexp.QuoteMeta(id) + `"[^>]*>([^<]*)<`).FindStringSubmatch(p.dom)
	if m == nil {
		t.Fatalf("page has no element #%s with text", id)
	}
	return html.UnescapeString(m[1])
}

// attr returns attribute name of the element with id.
func (p renderedPage) attr(t *testing.T, id, name string) string {
	t.Helper()
	m := regexp.MustCompile(`<[a-z]+ [^>]*id="` + regexp.QuoteMeta(id) + `"[^>]*>`).FindString(p.dom)
	if m == "" {
		t.Fatalf("page has no element #%s", id)
	}
	a := regexp.MustCompile(` ` + regexp.QuoteMeta(name) + `="([^"]*)"`).FindStringSubmatch(m)
	if a == nil {
		return ""
	}
	return html.UnescapeString(a[1])
}

// hasAttr reports whether the element with id has attribute name.
func (p renderedPage) hasAttr(t *testing.T, id, name string) bool {
	t.Helper()
	m := regexp.MustCompile(`<[a-z]+ [^>]*id="` + regexp.QuoteMeta(id) + `"[^>]*>`).FindString(p.dom)
	if m == "" {
		t.Fatalf("page has no element #%s", id)
	}
	return regexp.MustCompile(` ` + regexp.QuoteMeta(name) + `(=|[ >])`).MatchString(m)
}

// has reports whether the DOM holds s.
func (p renderedPage) has(s string) bool { return strings.Contains(p.dom, s) }

// peerNames returns the names of the peers in a status.
func peerNames(st appliance.Status) []string {
	var out []string
	for _, p := range st.Peers {
		out = append(out, p.Name)
	}
	return out
}

// countingProxy forwards to a node's HTTP and counts GET /status.
func countingProxy(t *testing.T, target string) (string, *atomic.Int64) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	rp := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/status" {
			n.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &n
}

// TestStatusPageInBrowser runs a two-node mesh (real PostgreSQL and
// RabbitMQ, nodes as processes) and loads the first node's status page in a
// headless chromium: the rendered page shows the broker state, the bindings
// and their age, and the peers the node sees, the same as /status says.
func TestStatusPageInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ, two nodes and a browser")
	}
	t.Parallel()
	alpha, beta, _ := startTwoNodes(t)

	// A program on alpha hosts a capability, one on beta another.
	for _, h := range []struct {
		node    *meshtest.Process
		capName string
	}{{alpha, "echo"}, {beta, "clock"}} {
		nc := h.node.Connect(t)
		if _, err := nc.QueueSubscribe("cap."+h.capName, "meshbox", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []*meshtest.Process{alpha, beta} {
		meshtest.WaitStatus(t, p.HTTPURL(), 20*time.Second, p.Node()+" connected to the broker", func(s appliance.Status) bool { return s.Broker.State == "connected" })
	}
	if requirePeers {
		meshtest.WaitStatus(t, alpha.HTTPURL(), 20*time.Second, "alpha's status listing beta as a peer", func(s appliance.Status) bool {
			return contains(peerNames(s), "beta")
		})
	}

	// Traffic for the trend charts: alpha's program calls beta's clock
	// until a sample of alpha's history has requests in it, beta up, and
	// an earlier sample to draw a line from.
	caller := alpha.Connect(t)
	meshtest.WaitFor(t, 30*time.Second, "a sample of alpha's history with requests and beta up", func() bool {
		for range 5 {
			if _, err := caller.Request("cap.clock", []byte("now?"), 2*time.Second); err != nil {
				return false
			}
		}
		tr := readTrends(t, alpha.HTTPURL())
		n := len(tr.At)
		return n >= 2 && slices.ContainsFunc(tr.Requests, func(r float64) bool { return r > 0 }) && tr.PeersUp[n-1] >= 1
	})

	// The page refreshes itself: with ?refresh=1 it fetches /status about
	// every second of the browser's (virtual) time.
	viaProxy, fetches := countingProxy(t, alpha.HTTPURL())
	page := renderPage(t, viaProxy+"/?refresh=1")
	st := meshtest.Status(t, alpha.HTTPURL())

	if n := fetches.Load(); n < 2 {
		t.Errorf("the page fetched /status %d times in 5s, want it refreshing (at least 2)", n)
	}
	if got := page.text(t, "node"); got != "alpha" {
		t.Errorf("node: got %q, want alpha", got)
	}
	if got, want := page.text(t, "version"), st.Version; got != want {
		t.Errorf("version: got %q, want %v", got, want)
	}
	if got, arch := page.text(t, "build"), st.Arch; !strings.Contains(got, arch) || !strings.Contains(got, "go1.") {
		t.Errorf("build: got %q, want the Go version and %q", got, arch)
	}
	if got := page.text(t, "live"); !strings.HasPrefix(got, "updated ") {
		t.Errorf("live indicator: got %q, want updated ...", got)
	}
	if page.attr(t, "banner", "class") == "on" {
		t.Errorf("banner shown: %q", page.text(t, "banner"))
	}

	// Broker state.
	if got := page.text(t, "broker-state"); got != "connected" {
		t.Errorf("broker state on the page: got %q, want connected", got)
	}
	if got := page.attr(t, "broker-state", "class"); !strings.Contains(got, "good") {
		t.Errorf("broker state class: got %q, want good (green)", got)
	}
	if bu := st.Broker.URL; bu != "" && !page.has(html.EscapeString(bu)) {
		t.Errorf("page lacks the broker URL %q", bu)
	}
	if !page.has(`id="broker-history"`) {
		t.Errorf("page lacks the broker history table")
	}

	// Bindings: from the database, live, age 0.
	if got := page.text(t, "bindings-source"); got != "db" {
		t.Errorf("bindings source on the page: got %q, want db", got)
	}
	if got, want := page.text(t, "bindings-revision"), st.Bindings.Revision; got != strconv.FormatInt(want, 10) {
		t.Errorf("bindings revision on the page: got %q, want %v", got, want)
	}
	if got := page.text(t, "bindings-age"); got != "0s" {
		t.Errorf("bindings age on the page: got %q, want 0s (live from the database)", got)
	}
	if got := page.attr(t, "bindings-age", "class"); strings.Contains(got, "warn") || strings.Contains(got, "bad") {
		t.Errorf("bindings age highlighted as %q while live", got)
	}

	// Peers: every peer the status reports is on the page, in the picture
	// and in the table.
	peers := peerNames(st)
	if requirePeers && !contains(peers, "beta") {
		t.Errorf("alpha's peers: got %v, want beta", peers)
	}
	if !requirePeers {
		t.Logf("peer check off (requirePeers): alpha reports peers %v", peers)
	}
	for _, p := range peers {
		if !page.has(`data-peer="`+p+`"`) || !page.has(`data-node="`+p+`"`) {
			t.Errorf("peer %s is in the status but not on the page", p)
		}
	}
	if len(peers) == 0 && !page.has("no peers") && !page.has("does not report peers") {
		t.Errorf("no peers, and the page does not say so")
	}
	if !page.has(`data-node="alpha"`) {
		t.Errorf("the mesh picture lacks this node")
	}

	// The trend charts draw alpha's own history: every sample, the
	// requests it carried, and the link connected.
	tr := readTrends(t, alpha.HTTPURL())
	for _, id := range []string{"trend-outbox", "trend-messages", "trend-rows", "trend-peers", "trend-broker"} {
		if got := chartPoints(t, page, id); got < 2 || got > len(tr.At) {
			t.Errorf("chart #%s: drew %d samples, want at least 2 and at most the %d /trends has now", id, got, len(tr.At))
		}
	}
	if !page.has(`data-series="requests"`) || !page.has(`data-state="connected"`) {
		t.Errorf("the charts lack the requests line or the broker's connected band")
	}

	// Capabilities this node reports are on the page.
	for _, name := range st.Capabilities.Local {
		if name != "" && !page.has(">"+name+"<") {
			t.Errorf("local capability %q is in the status but not on the page", name)
		}
	}

	// The screenshot for the README.
	shot := filepath.Join(t.TempDir(), "status-page.png")
	if os.Getenv(screenshotEnv) != "" {
		shot = filepath.Join("..", "..", "docs", "status-page.png")
		if err := os.MkdirAll(filepath.Dir(shot), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	abs, err := filepath.Abs(shot)
	if err != nil {
		t.Fatal(err)
	}
	chromium(t, alpha.HTTPURL()+"/", "--screenshot="+abs, "--window-size=1280,1000", "--hide-scrollbars")
	f, err := os.Open(abs)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1280 || b.Dy() != 1000 {
		t.Errorf("screenshot size: got %dx%d, want 1280x1000", b.Dx(), b.Dy())
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestStatusPageOnCache loads the page of a node that runs from its cache:
// the source and the age are highlighted, with the reason in words.
func TestStatusPageOnCache(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, a node and a browser")
	}
	t.Parallel()
	meshtest.Binary(t) // built before cli's timeout starts
	pg := meshtest.Postgres(t)
	db := pg.Database(t)
	// No broker answers at this address: the page shows a node that is
	// cut off from both.
	noBroker := "amqp://127.0.0.1:" + strconv.Itoa(meshtest.ClosedPort(t)) + "/"
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", noBroker); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	upstream := "127.0.0.1:" + strconv.Itoa(pg.Port())
	px := meshtest.NewProxy(t, upstream)
	viaProxy := px.Rewrite(db, upstream)
	data := t.TempDir()

	p := meshtest.StartProcess(t, "--node", "alpha", "--db", viaProxy, "--data", data)
	// A loaded machine may answer after the start's 1.5 s; the load goes
	// on and its bindings apply when it ends.
	meshtest.WaitStatus(t, p.HTTPURL(), 15*time.Second, "first start: bindings from the database",
		func(st appliance.Status) bool { return st.Bindings.Source == "db" })
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	px.Cut(t)
	time.Sleep(1100 * time.Millisecond) // the cached bindings age by a second
	p = meshtest.StartProcess(t, "--node", "alpha", "--db", viaProxy, "--data", data)
	if st := meshtest.Status(t, p.HTTPURL()); st.Bindings.Source != "cache" {
		t.Fatalf("second start: source %q, want cache", st.Bindings.Source)
	}

	page := renderPage(t, p.HTTPURL()+"/")
	if got := page.text(t, "bindings-source"); got != "cache" {
		t.Errorf("bindings source: got %q, want cache", got)
	}
	if got := page.attr(t, "bindings-source", "class"); !strings.Contains(got, "warn") {
		t.Errorf("bindings source class: got %q, want warn (highlighted)", got)
	}
	age, err := strconv.Atoi(page.attr(t, "bindings-age", "data-age-seconds"))
	if err != nil || age < 1 {
		t.Errorf("bindings age: got %q (%v), want at least 1s", page.attr(t, "bindings-age", "data-age-seconds"), err)
	}
	if got := page.attr(t, "bindings-age", "class"); !strings.Contains(got, "warn") && !strings.Contains(got, "bad") {
		t.Errorf("bindings age class: got %q, want highlighted", got)
	}
	if got := page.text(t, "bindings-warning"); !strings.Contains(got, "running from the local cache") {
		t.Errorf("bindings note: got %q, want it to say the node runs from its cache", got)
	}
	if page.hasAttr(t, "bindings-warning", "hidden") {
		t.Errorf("bindings note is hidden")
	}
	if got := page.attr(t, "bindings-card", "class"); got != "caution" && got != "alert" {
		t.Errorf("bindings card: got class %q, want caution or alert", got)
	}
}

// TestStatusPageRendersAnyStatus serves the node's page with made-up status
// documents: a bare one (sections a node does not report yet) and a busy one
// (peers, stalls, errors, text that looks like markup), and checks what the
// browser shows.
func TestStatusPageRendersAnyStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node and a browser")
	}
	t.Parallel()
	p := meshtest.StartProcess(t, "--node", "solo")
	resp, err := http.Get(p.HTTPURL() + "/")
	if err != nil {
		t.Fatal(err)
	}
	pageHTML, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	csp := resp.Header.Get("Content-Security-Policy")

	var status atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Content-Security-Policy", csp)
			_, _ = w.Write(pageHTML)
		case "/status":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, status.Load().(string))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()

	status.Store(`{"node":"bare","version":"v9"}`)
	page := renderPage(t, srv.URL+"/")
	if got := page.text(t, "node"); got != "bare" {
		t.Errorf("bare: node %q, want bare", got)
	}
	if page.attr(t, "banner", "class") == "on" {
		t.Errorf("bare: banner %q, want none", page.text(t, "banner"))
	}
	if got := page.text(t, "broker-state"); got != "not reported" {
		t.Errorf("bare: broker state %q, want not reported", got)
	}
	if !page.has("this node does not report peers") {
		t.Errorf("bare: the page does not say peers are not reported")
	}

	now := time.Now().UTC()
	ago := func(d time.Duration) string { return now.Add(-d).Format(time.RFC3339) }
	busy := map[string]any{
		"node": "attic", "version": "v1.2.3", "started_at": ago(time.Hour),
		"broker": map[string]any{"state": "offline", "since": ago(time.Minute), "url": "amqp://attic:xxxxx@broker/",
			"history": []any{map[string]any{"state": "connected", "at": ago(time.Hour)}, map[string]any{"state": "offline", "at": ago(time.Minute), "reason": "connection reset"}}},
		"bindings": map[string]any{"source": "cache", "revision": 12, "age_seconds": 200000, "warning": "bindings are older than 24h0m0s"},
		"outbox":   map[string]any{"depth": 3, "bytes": 900, "oldest_age_seconds": 61, "max_bytes": 1000},
		"stalls":   []any{map[string]any{"stage": "transcode", "reason": "no consumer", "oldest_age_seconds": 400}},
		"peers": []any{
			map[string]any{"node": "garage", "state": "up", "capabilities": []any{"camera.snapshot"}},
			map[string]any{"node": "cellar", "state": "gone"},
		},
		"capabilities": map[string]any{"local": []any{"echo"}, "remote": map[string]any{"camera.snapshot": []any{"garage"}}},
		"errors": []any{map[string]any{"at": ago(time.Minute), "level": "ERROR", "component": "bridge", "message": "<script>alert(1)</script>", "detail": "<b>bold</b>"},
			map[string]any{"at": ago(2 * time.Minute), "level": "WARN", "component": "keys", "message": "this node lacks a content key of the mesh"}},
		"problems": []any{"mesh database: the database refused the login of user attic"},
		"warnings": []any{"the broker link is not encrypted"},
		"notes":    []any{"the local NATS server is open"},
		"modules": []any{
			map[string]any{"module": "backups", "selection": "stable", "autostart": true, "state": "running", "pid": 4242, "uptime_seconds": 90,
				"warnings": []any{"module backups declares stage `nightly-backup` but does not serve it"}},
			map[string]any{"module": "photos", "selection": "nightly", "autostart": true, "state": "crash-looping", "restarts": 5,
				"last_exit": map[string]any{"at": ago(time.Minute), "code": 2, "reason": "exited with status 2"}, "error": "failed 5 times within 2m0s"},
		},
		"rows": []any{
			map[string]any{"table": "jobs", "rows": 42, "pending": 7, "behind": 3, "offset": 100, "synced": true, "last_snapshot": ago(time.Hour)},
			map[string]any{"table": "secrets", "scope": "vault", "rows": 0, "pending": 0, "synced": true,
				"refused": map[string]any{"unopened": 5}, "alarm": "log offset 3 from node.x.g1: does not open"},
		},
	}
	b, _ := json.Marshal(busy)
	status.Store(string(b))
	page = renderPage(t, srv.URL+"/")
	checks := []struct {
		id, attr, want string
	}{
		{"broker-state", "", "offline"},
		{"bindings-source", "", "cache"},
		{"bindings-age", "", "2d 7h"},
		{"bindings-age", "class", "badge bad"},
		{"bindings-card", "class", "alert"},
		{"outbox-depth", "", "3"},
		{"outbox-oldest", "", "1m 1s"},
		{"outbox-card", "class", "caution"},
		{"stalls-card", "class", "alert"},
		{"modules-card", "class", "wide alert"},
		{"modules-summary", "", "— 1 crash-looping, 1 running"},
		{"rows-card", "class", "wide alert"},
		{"rows-summary", "", "— 2 tables, 7 local writes waiting for the broker, 1 with an alarm"},
	}
	if got := page.attr(t, "broker-state", "class"); !strings.Contains(got, "bad") {
		t.Errorf("busy: broker state class %q, want bad (red)", got)
	}
	for _, c := range checks {
		var got string
		if c.attr == "" {
			got = page.text(t, c.id)
		} else {
			got = page.attr(t, c.id, c.attr)
		}
		if got != c.want {
			t.Errorf("busy: #%s %s: got %q, want %q", c.id, c.attr, got, c.want)
		}
	}
	for _, want := range []string{`data-module="backups"`, `data-module="photos"`, "4242", "1m 30s", "exited with status 2",
		"failed 5 times within 2m0s", "module backups declares stage `nightly-backup` but does not serve it",
		`data-peer="garage"`, `data-peer="cellar"`, `data-node="garage"`, "transcode", "no consumer",
		"camera.snapshot", "bindings are older than 24h0m0s", "connection reset", "vault", "log offset 3 from node.x.g1: does not open"} {
		if !page.has(want) {
			t.Errorf("busy: page lacks %q", want)
		}
	}
	// The problems head the page; each logged entry and standing
	// condition shows the level it has in the log.
	if page.hasAttr(t, "problems", "hidden") || !page.has("<li>mesh database: the database refused the login of user attic</li>") {
		t.Errorf("busy: the problems are not shown above the rest")
	}
	for _, want := range []string{`<span class="badge warn">WARN</span></td><td>keys</td>`, `<span class="badge bad">ERROR</span></td><td>bridge</td>`,
		`<span class="badge warn">WARN</span></td><td>node</td><td>the broker link is not encrypted`, `<span class="badge">INFO</span></td><td>node</td><td>the local NATS server is open`} {
		if !page.has(want) {
			t.Errorf("busy: page lacks %s", want)
		}
	}
	// Text from the status is shown as text, never run or parsed as markup.
	if !page.has("&lt;script&gt;alert(1)&lt;/script&gt;: &lt;b&gt;bold&lt;/b&gt;") {
		t.Errorf("busy: the error message is not shown as escaped text")
	}
	if page.has("<b>bold</b>") {
		t.Errorf("busy: markup from the status was inserted into the page")
	}

	// A node of a mesh without a broker yet is not standalone: the broker
	// card says why in red, and the picture has the broker it lacks.
	status.Store(`{"node":"cellar","standalone":false,"peers":[],` +
		`"broker":{"state":"none","reason":"no broker yet: this node has no bindings, because the mesh database refuses its login"}}`)
	page = renderPage(t, srv.URL+"/")
	if got, cls := page.text(t, "broker-reason"), page.attr(t, "broker-reason", "class"); !strings.Contains(got, "the mesh database refuses its login") || cls != "note bad" {
		t.Errorf("mesh node without a broker: broker note %q class %q, want the reason, in red", got, cls)
	}
	if page.attr(t, "broker-card", "class") != "alert" || !page.has(`class="broker"`) {
		t.Errorf("mesh node without a broker: broker card class %q, broker drawn %v; want an alert and the broker drawn",
			page.attr(t, "broker-card", "class"), page.has(`class="broker"`))
	}

	// A node that stops answering: the page says so and keeps the last data.
	status.Store("not json")
	page = renderPage(t, srv.URL+"/")
	if page.attr(t, "banner", "class") != "on" || !strings.Contains(page.text(t, "banner"), "not answering") {
		t.Errorf("broken status: banner class %q text %q, want it shown, saying the node is not answering",
			page.attr(t, "banner", "class"), page.text(t, "banner"))
	}
	if got := page.attr(t, "live", "class"); got != "stale" {
		t.Errorf("broken status: live indicator class %q, want stale", got)
	}
}

// TestStandaloneStatusPage: a standalone node (no broker configured) is a
// mode, not a fault: its status page says so without an alarm, and a
// command its own program handles is listed in flight, within its lease.
func TestStandaloneStatusPage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node and a browser")
	}
	t.Parallel()
	p := meshtest.StartProcess(t, "--node", "solo")
	host := natsConn(t, p)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	if _, err := host.Subscribe("work.print", func(m *nats.Msg) {
		<-release
		_ = m.Respond(nil)
	}); err != nil {
		t.Fatal(err)
	}
	flush(t, host)
	caller := natsConn(t, p)
	var last string
	if !meshtest.Poll(10*time.Second, func() bool { // until the node sees its handler
		o, resp, err := ledger.Submit(caller, "cmd.print", []byte("page"), 5*time.Second)
		last = fmt.Sprint(o, resp, err)
		return o == ledger.Acked
	}) {
		t.Fatalf("submit print: %s", last)
	}
	var cmds []bridge.CommandStatus
	if !meshtest.Poll(10*time.Second, func() bool {
		cmds = meshtest.Status(t, p.HTTPURL()).Commands
		return len(cmds) == 1
	}) {
		t.Fatalf("standalone node's commands in flight: %+v, want the one its program handles", cmds)
	}
	if c := cmds[0]; c.Stage != "print" || c.LeaseRemainingSeconds <= 0 {
		t.Errorf("command in flight: %+v, want stage print within its lease", c)
	}
	page := renderPage(t, p.HTTPURL()+"/")
	if cls := page.attr(t, "broker-reason", "class"); strings.Contains(cls, "bad") {
		t.Errorf("standalone broker note: class %q, want no alarm", cls)
	}
	if got := page.text(t, "broker-reason"); !strings.HasPrefix(got, "Standalone: no broker is configured") {
		t.Errorf("standalone broker note: %q", got)
	}
	if cls := page.attr(t, "broker-card", "class"); strings.Contains(cls, "alert") {
		t.Errorf("broker card: class %q, want no alert", cls)
	}
	if !page.has(">print<") {
		t.Errorf("the page does not list the command in flight of stage print")
	}
	// No broker is drawn for a node that has none, and the open NATS
	// server it logged at INFO is a note, not a warning.
	if page.has(`class="broker"`) {
		t.Errorf("the mesh picture of a standalone node draws a broker")
	}
	if !page.has(`<span class="badge">INFO</span></td><td>node</td><td>the local NATS server is open`) || page.has(">WARN</span></td><td>node</td><td>the local NATS server is open") {
		t.Errorf("the open local NATS server of a standalone node is not shown as the INFO it was logged at")
	}
	if !page.hasAttr(t, "problems", "hidden") {
		t.Errorf("a standalone node shows problems: %q", page.text(t, "problems-list"))
	}
}

// TestStandaloneDeadLetters: a standalone node's dead letters (kept in its
// outbox, it has no broker) are listed and shown by meshbox dlq, not
// refused as "mesh unreachable".
func TestStandaloneDeadLetters(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	t.Parallel()
	p := meshtest.StartProcess(t, "--node", "solo")
	host := natsConn(t, p)
	if _, err := host.Subscribe("work.print", func(m *nats.Msg) {
		r := nats.NewMsg(m.Reply)
		r.Header.Set("Nats-Service-Error", "out of paper")
		r.Header.Set("Nats-Service-Error-Code", "422") // permanent: dead at once
		_ = m.RespondMsg(r)
	}); err != nil {
		t.Fatal(err)
	}
	flush(t, host)
	caller := natsConn(t, p)
	if !meshtest.Poll(10*time.Second, func() bool {
		o, _, _ := ledger.Submit(caller, "cmd.print", []byte("page"), 5*time.Second)
		return o == ledger.Acked
	}) {
		t.Fatal("the standalone node never accepted the command")
	}
	onSolo := []string{"MESHBOX_SERVER=" + p.NATSURL(), "MESHBOX_DATA=" + p.DataDir()}
	var out, errOut string
	var code int
	if !meshtest.Poll(10*time.Second, func() bool {
		code, out, errOut = cliEnv(t, onSolo, "dlq", "list")
		return code == 0 && strings.Contains(out, "print")
	}) {
		t.Fatalf("dlq list on a standalone node: exit %d: %q %q, want the dead letter of print", code, out, errOut)
	}
	if !strings.Contains(out, "out of paper") || !strings.Contains(out, "kept in this node's outbox") || strings.Contains(out+errOut, "unreachable") {
		t.Errorf("dlq list: %q, want the reason and that it waits in the outbox", out)
	}
	code, out, errOut = cliEnv(t, onSolo, "dlq", "list", "print", "--json")
	if code != 0 || !strings.Contains(out, `"waiting": true`) {
		t.Fatalf("dlq list print --json: exit %d: %q %q", code, out, errOut)
	}
	id := regexp.MustCompile(`"id": "([^"]+)"`).FindStringSubmatch(out)
	if id == nil {
		t.Fatalf("no id in %s", out)
	}
	if code, out, errOut := cliEnv(t, onSolo, "dlq", "show", "print", id[1]); code != 0 || !strings.Contains(out, "out of paper") {
		t.Errorf("dlq show print %s: exit %d: %q %q", id[1], code, out, errOut)
	}
}
