package appliance

import (
	"crypto/sha256"
	"encoding/base64"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func getPage(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

func TestStatusPageServed(t *testing.T) {
	a := startNode(t, "pagenode", t.TempDir())

	resp, body := getPage(t, a.HTTPURL()+"/")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /: got %d, want 200", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Errorf("Content-Type: got %q, want text/html", ct)
	}
	if body != string(statusPage) {
		t.Errorf("GET /: body is not the embedded page")
	}
	// The page draws itself from /status and from nowhere else.
	for _, want := range []string{`fetch("status"`, `id="broker-state"`, `id="bindings-age"`, `id="mesh-svg"`, `id="peers"`} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	for _, bad := range []string{"http://", "https://"} {
		for _, line := range strings.Split(body, "\n") {
			if strings.Contains(line, bad) && !strings.Contains(line, "http://www.w3.org/2000/svg") {
				t.Errorf("page refers to an outside address: %s", strings.TrimSpace(line))
			}
		}
	}

	// Only the page's own inline style and script may run.
	csp := resp.Header.Get("Content-Security-Policy")
	for _, block := range [][2]string{{"<style>", "</style>"}, {"<script>", "</script>"}} {
		_, rest, ok := strings.Cut(body, block[0])
		if !ok {
			t.Fatalf("page has no %s", block[0])
		}
		content, _, _ := strings.Cut(rest, block[1])
		sum := sha256.Sum256([]byte(content))
		if want := "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"; !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks the hash of the %s block %s", csp, block[0], want)
		}
	}
	if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Errorf("CSP: got %q, want default-src 'none' and connect-src 'self'", csp)
	}

	// Only "/" is the page; other paths stay 404.
	if resp, _ := getPage(t, a.HTTPURL()+"/nothing-here"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /nothing-here: got %d, want 404", resp.StatusCode)
	}
}

func TestInlineHashes(t *testing.T) {
	h := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
	}
	tests := []struct {
		page string
		want []string
	}{
		{"<p>no script</p>", []string{"'none'"}},
		{"<script>a()</script>", []string{h("a()")}},
		{"<script>a()</script><p/><script>\nb()\n</script>", []string{h("a()"), h("\nb()\n")}},
		{"<script>unterminated", []string{"'none'"}},
	}
	for _, tt := range tests {
		got := inlineHashes([]byte(tt.page), "<script>", "</script>")
		if strings.Join(got, " ") != strings.Join(tt.want, " ") {
			t.Errorf("inlineHashes(%q): got %v, want %v", tt.page, got, tt.want)
		}
	}
}

func TestNodeMetrics(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Node = "metrics"
	cfg.DataDir = t.TempDir()
	a, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	gather := func() map[string]*dto.MetricFamily {
		t.Helper()
		mfs, err := a.tel.registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*dto.MetricFamily{}
		for _, mf := range mfs {
			out[mf.GetName()] = mf
		}
		return out
	}
	logged := func(mfs map[string]*dto.MetricFamily, level, component string) float64 {
		for _, m := range mfs["meshbox_log_messages_total"].GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["level"] == level && labels["component"] == component {
				return m.GetCounter().GetValue()
			}
		}
		return 0
	}

	mfs := gather()
	if got := mfs["meshbox_up"].GetMetric()[0].GetGauge().GetValue(); got != 1 {
		t.Errorf("meshbox_up: got %v, want 1", got)
	}
	bi := mfs["meshbox_build_info"].GetMetric()
	if len(bi) != 1 {
		t.Fatalf("meshbox_build_info: got %d series, want 1", len(bi))
	}
	got := map[string]string{}
	for _, l := range bi[0].GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	b := Build()
	for name, want := range map[string]string{"version": b.Version, "commit": b.Commit, "goversion": runtime.Version(),
		"arch": runtime.GOOS + "/" + runtime.GOARCH} {
		if got[name] != want {
			t.Errorf("meshbox_build_info %s: got %q, want %q", name, got[name], want)
		}
	}
	if got := logged(mfs, "WARN", "bridge"); got != 0 {
		t.Fatalf("warnings before any was logged: got %v, want 0", got)
	}

	a.Logger().With("component", "bridge").Warn("broker link lost")
	a.Logger().With("component", "bridge").Warn("broker link lost")
	a.Logger().With("component", "cache").Error("database unreachable")
	a.Logger().Info("not counted")
	// More than the ring holds: the counter keeps counting.
	for range 60 {
		a.Logger().With("component", "node").Warn("peer gone")
	}
	mfs = gather()
	for _, c := range []struct {
		level, component string
		want             float64
	}{{"WARN", "bridge", 2}, {"ERROR", "cache", 1}, {"WARN", "node", 60}, {"INFO", "", 0}} {
		if got := logged(mfs, c.level, c.component); got != c.want {
			t.Errorf("meshbox_log_messages_total{level=%q,component=%q}: got %v, want %v", c.level, c.component, got, c.want)
		}
	}
	if err := prometheus.NewPedanticRegistry().Register(newNodeCollector(newErrorRing(1))); err != nil {
		t.Errorf("pedantic registry refuses the collector: %v", err)
	}
}
