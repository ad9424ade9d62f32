package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// browserPage is the page the WebSocket tests load in headless Chromium:
// it connects to the node's WebSocket listener with the official nats.ws
// client and a program's credential, subscribes to an event topic, says
// so, calls a capability, waits for the event, and posts what happened
// (or each refusal it met) back to the test's server.
const browserPage = `<!doctype html>
<html><head><meta charset="utf-8"><title>meshbox WebSocket test</title></head>
<body><script id="cfg" type="application/json">%s</script>
<script>
window.addEventListener("error", (e) => fetch("/log", { method: "POST", body: JSON.stringify({ error: String(e.message) }) }));
window.addEventListener("unhandledrejection", (e) => fetch("/log", { method: "POST", body: JSON.stringify({ rejection: String(e.reason) }) }));
</script>
<script type="module">
import { connect, nkeyAuthenticator, StringCodec } from "/nats.js";
const cfg = JSON.parse(document.getElementById("cfg").textContent);
const sc = StringCodec();
const out = {};
const post = (path, o) => fetch(path, { method: "POST", body: JSON.stringify(o) });
const within = (p, ms, what) => Promise.race([p, new Promise((_, no) => setTimeout(() => no(new Error(what + ": nothing within " + ms + " ms")), ms))]);
try {
  const nc = await connect({ servers: cfg.ws, authenticator: nkeyAuthenticator(new TextEncoder().encode(cfg.seed)),
                             inboxPrefix: cfg.inbox, name: "browser page", maxReconnectAttempts: 0 });
  nc.closed().then((err) => { if (err) post("/log", { closed: String(err) }); });
  const sub = nc.subscribe(cfg.topic, { max: 1 });
  const got = (async () => { for await (const m of sub) return sc.decode(m.data); return ""; })();
  await nc.flush();
  await post("/subscribed", {});
  try {
    const r = await nc.request(cfg.cap, sc.encode("from the browser"), { timeout: 10000 });
    out.reply = sc.decode(r.data);
  } catch (e) { out.call_error = String(e); }
  try { out.event = await within(got, cfg.wait_ms, "event"); } catch (e) { out.event_error = String(e); }
  await nc.close();
} catch (e) { out.connect_error = String(e); }
await post("/result", out);
</script></body></html>`

// pageConfig is what the page is given: the WebSocket URL, the program's
// nkey seed and inbox prefix, the event subject and the capability.
type pageConfig struct {
	WS     string `json:"ws"`
	Seed   string `json:"seed"`
	Inbox  string `json:"inbox"`
	Topic  string `json:"topic"`
	Cap    string `json:"cap"`
	WaitMS int    `json:"wait_ms"`
}

// pageResult is what the page posts at its end.
type pageResult struct {
	Reply        string `json:"reply"`
	CallError    string `json:"call_error"`
	Event        string `json:"event"`
	EventError   string `json:"event_error"`
	ConnectError string `json:"connect_error"`
}

// pageServer serves browserPage (at /page/<name>, one configuration
// each), the nats.ws module, and takes the pages' reports.
type pageServer struct {
	addr       string // 127.0.0.1:port
	pages      map[string]pageConfig
	subscribed chan string
	results    chan pageResultFrom
}

type pageResultFrom struct {
	page string
	res  pageResult
}

func newPageServer(t *testing.T, pages map[string]pageConfig) *pageServer {
	t.Helper()
	module := filepath.Join("browser", "node_modules", "nats.ws", "esm", "nats.js")
	if _, err := os.Stat(module); err != nil {
		t.Fatalf("the nats.ws client is not installed (%v): run `make services` (testing/services.sh) first", err)
	}
	ps := &pageServer{pages: pages, subscribed: make(chan string, 8), results: make(chan pageResultFrom, 8)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /nats.js", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript")
		http.ServeFile(w, r, module)
	})
	mux.HandleFunc("GET /page/{name}", func(w http.ResponseWriter, r *http.Request) {
		cfg, ok := ps.pages[r.PathValue("name")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		data, _ := json.Marshal(cfg) // escapes <, > and &: it cannot end the script element
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, browserPage, data)
	})
	page := func(r *http.Request) string {
		ref := r.Header.Get("Referer")
		return ref[strings.LastIndex(ref, "/")+1:]
	}
	mux.HandleFunc("POST /subscribed", func(w http.ResponseWriter, r *http.Request) { ps.subscribed <- page(r) })
	mux.HandleFunc("POST /log", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		t.Logf("page %s: %s", page(r), body)
	})
	mux.HandleFunc("POST /result", func(w http.ResponseWriter, r *http.Request) {
		var res pageResult
		if err := json.NewDecoder(r.Body).Decode(&res); err != nil {
			t.Errorf("page %s posted a bad result: %v", page(r), err)
		}
		ps.results <- pageResultFrom{page(r), res}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }() // ends with Close in cleanup
	t.Cleanup(func() { _ = srv.Close() })
	ps.addr = ln.Addr().String()
	return ps
}

// openInBrowser opens pageURL in a headless Chromium that runs until the
// test ends (or is killed after 2 minutes).
func openInBrowser(t *testing.T, pageURL string) {
	t.Helper()
	profile := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cmd := exec.CommandContext(ctx, chromiumPath(t),
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-default-apps", "--disable-extensions", "--no-default-browser-check",
		"--enable-logging=stderr", "--user-data-dir="+profile, pageURL)
	cmd.Env = append(os.Environ(), "HOME="+profile, "XDG_CONFIG_HOME="+profile, "XDG_CACHE_HOME="+profile)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("chromium: %v", err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // chromium and its helpers
		_ = cmd.Wait()
		cancel()
		if t.Failed() {
			t.Logf("chromium on %s, the end of its log:\n%s", pageURL, tail(stderr.String(), 30))
		}
	})
}

// TestWebSocketBrowserAcrossTheMesh: a page in headless Chromium, with
// the official nats.ws client and a program's credential, connects to
// node alpha's WebSocket listener, receives an event a program on node
// beta publishes, and calls a capability beta hosts. Refusals, each with
// its control above: a program without the rights (its subscription and
// its call refused, as on the NATS port), a page of an origin the node
// does not allow, and a client without a credential.
func TestWebSocketBrowserAcrossTheMesh(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker, a database and a browser")
	}
	meshtest.Binary(t)
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	db := meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", meshtest.NoCredential(vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	mesh(t, db, "node", "add", "beta", "--record-only")

	// The test's own page server: its 127.0.0.1 origin is allowed, its
	// localhost one is not.
	pages := map[string]pageConfig{}
	ps := newPageServer(t, pages)
	allowed, other := "http://"+ps.addr, "http://localhost:"+ps.addr[strings.LastIndex(ps.addr, ":")+1:]
	conf := filepath.Join(t.TempDir(), "alpha.json")
	if err := os.WriteFile(conf, []byte(`{"nats_websocket": "127.0.0.1:0", "nats_websocket_origins": ["`+allowed+`"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	alpha := meshtest.StartProcess(t, "--node", "alpha", "--db", db, "--config", conf)
	beta := meshtest.StartProcess(t, "--node", "beta", "--db", db)
	for _, p := range []*meshtest.Process{alpha, beta} {
		meshtest.WaitStatus(t, p.HTTPURL(), 20*time.Second, p.Node()+" connected to the broker", func(s appliance.Status) bool { return s.Broker.State == "connected" })
		waitKeysInStep(t, p)
	}
	st := meshtest.Status(t, alpha.HTTPURL())
	wsURL := st.NATS.WebSocket
	if !strings.HasPrefix(wsURL, "ws://127.0.0.1:") {
		t.Fatalf("alpha's status: nats.websocket %q, want ws://127.0.0.1:<port>", wsURL)
	}

	// Beta hosts the capability and will publish the event.
	bnc := natsConn(t, beta)
	if _, err := bnc.Subscribe(wire.CapPrefix+"echo", func(m *nats.Msg) { _ = m.Respond(append([]byte("beta echoes: "), m.Data...)) }); err != nil {
		t.Fatal(err)
	}
	flush(t, bnc)
	anc := natsConn(t, alpha)
	waitCallable(t, anc, wire.CapPrefix+"echo", nil, func(m *nats.Msg) bool { return strings.HasPrefix(string(m.Data), "beta echoes") })

	dash := programs.Program{Name: "dash", Subscribe: []string{"home.>"}, Call: []string{"echo"}}
	meek := programs.Program{Name: "meek", Subscribe: []string{"garden.>"}}
	creds := map[string]string{}
	seed := func(p programs.Program) string {
		creds[p.Name] = meshtest.AddProgram(t, alpha.NATSURL(), alpha.DataDir(), p)
		data, err := os.ReadFile(creds[p.Name])
		if err != nil {
			t.Fatal(err)
		}
		// The file's seed line, as a page would hold it (the file
		// starts with comment lines saying what it is).
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "SU") {
				return line
			}
		}
		t.Fatalf("no seed in %s", creds[p.Name])
		return ""
	}
	topic := wire.EventSubject("home.kitchen.temp")
	pages["dash"] = pageConfig{WS: wsURL, Seed: seed(dash), Inbox: dash.InboxPrefix(), Topic: topic, Cap: wire.CapPrefix + "echo", WaitMS: 30000}
	pages["meek"] = pageConfig{WS: wsURL, Seed: seed(meek), Inbox: meek.InboxPrefix(), Topic: topic, Cap: wire.CapPrefix + "echo", WaitMS: 8000}
	pages["elsewhere"] = pages["dash"]

	// The control and the narrow program side by side; the foreign
	// origin's page too.
	openInBrowser(t, allowed+"/page/dash")
	openInBrowser(t, allowed+"/page/meek")
	openInBrowser(t, other+"/page/elsewhere")

	// Beta publishes until the pages are done: alpha binds the topic
	// from the broker once it sees the page's subscription.
	stop := make(chan struct{})
	defer close(stop)
	go func() { // exits on stop
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
				_ = bnc.Publish(topic, []byte(fmt.Sprintf("21.5 C #%d", i)))
			}
		}
	}()
	results := map[string]pageResult{}
	deadline := time.After(90 * time.Second)
	for len(results) < 3 {
		select {
		case r := <-ps.results:
			t.Logf("page %s: %+v", r.page, r.res)
			results[r.page] = r.res
		case <-ps.subscribed:
		case <-deadline:
			t.Fatalf("after 90s the browser pages reported %d of 3 results: %v", len(results), results)
		}
	}

	// The control: the event from beta, the capability on beta.
	if r := results["dash"]; r.ConnectError != "" || r.Reply != "beta echoes: from the browser" || !strings.HasPrefix(r.Event, "21.5 C #") {
		t.Errorf("page with dash's credential: %+v, want beta's echo and beta's event", r)
	}
	// The narrow program: refused both, as on the NATS port.
	r := results["meek"]
	if r.ConnectError != "" {
		t.Errorf("page with meek's credential: could not connect: %s", r.ConnectError)
	}
	if r.Reply != "" || !strings.Contains(strings.ToLower(r.CallError), "permission") {
		t.Errorf("page with meek's credential calls echo: reply %q, error %q; want a permissions violation", r.Reply, r.CallError)
	}
	if r.Event != "" || !strings.Contains(strings.ToLower(r.EventError), "permission") {
		t.Errorf("page with meek's credential subscribes to %s: event %q, error %q; want a permissions violation", topic, r.Event, r.EventError)
	}
	// A page of another origin never gets a connection.
	if r := results["elsewhere"]; r.ConnectError == "" || r.Reply != "" || r.Event != "" {
		t.Errorf("page of origin %s: %+v, want its connection refused", other, r)
	}

	// Without a credential a client is refused (a node in a mesh takes
	// none), over WebSocket as over NATS.
	if nc, err := nats.Connect(wsURL, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Errorf("a WebSocket client without a credential connected to alpha")
	} else if e := strings.ToLower(err.Error()); !strings.Contains(e, "authorization") && !strings.Contains(e, "broken pipe") &&
		!strings.Contains(e, "eof") && !strings.Contains(e, "reset by peer") {
		// The server says so and closes the connection; a client still
		// writing its CONNECT may see the close first.
		t.Errorf("a WebSocket client without a credential: %v, want an authorization violation (or the connection closed on it)", err)
	}
	// The same credential works from Go over WebSocket: one listener, one
	// set of rights.
	nc := meshtest.ProgramConn(t, wsURL, creds["dash"], dash)
	if _, err := nc.Request(wire.CapPrefix+"echo", []byte("from go"), 10*time.Second); err != nil {
		t.Errorf("dash from nats.go over WebSocket calls echo: %v", err)
	}
}
