package e2e

import (
	"encoding/json"
	"image"
	"image/png"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// readTrends reads a node's GET /trends.
func readTrends(t *testing.T, httpURL string) appliance.Trends {
	t.Helper()
	resp, err := http.Get(httpURL + "/trends")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tr appliance.Trends
	if err := json.NewDecoder(resp.Body).Decode(&tr); err != nil {
		t.Fatalf("trends: %v", err)
	}
	return tr
}

// chartPoints returns the samples the chart with id says it drew.
func chartPoints(t *testing.T, page renderedPage, id string) int {
	t.Helper()
	n, err := strconv.Atoi(page.attr(t, id, "data-points"))
	if err != nil {
		t.Fatalf("chart #%s: data-points %q: %v", id, page.attr(t, id, "data-points"), err)
	}
	return n
}

// countColor counts the pixels of img within 40 of c in each channel.
func countColor(img image.Image, c [3]uint8) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if near(r>>8, c[0]) && near(g>>8, c[1]) && near(bl>>8, c[2]) {
				n++
			}
		}
	}
	return n
}

func near(v uint32, want uint8) bool { return math.Abs(float64(v)-float64(want)) <= 40 }

// screenshot loads pageURL in the browser and writes a PNG of it to the
// test's temporary directory; it returns the image and its file.
func screenshot(t *testing.T, pageURL string, width, height int) (image.Image, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "status-page.png")
	chromium(t, pageURL, "--screenshot="+file, "--window-size="+strconv.Itoa(width)+","+strconv.Itoa(height), "--hide-scrollbars")
	f, err := os.Open(file)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != width || b.Dy() != height {
		t.Errorf("screenshot size: got %dx%d, want %dx%d", b.Dx(), b.Dy(), width, height)
	}
	t.Logf("screenshot: %s", file)
	return img, file
}

// TestStatusPageTrends serves the node's page with a made-up half hour of
// history (a backlog that drains, traffic, a peer lost for a while, the
// broker offline then back) and checks in headless Chromium that every
// chart is drawn with all its samples, the broker's timeline with a band
// per state, and that the screenshot shows the lines.
func TestStatusPageTrends(t *testing.T) {
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

	const n = 360
	now := time.Now()
	tr := appliance.Trends{EverySeconds: 5}
	for i := range n {
		tr.At = append(tr.At, now.Add(-time.Duration(n-1-i)*5*time.Second).UnixMilli())
		outbox := int64(0)
		if i >= 200 && i < 260 {
			outbox = int64(40 - math.Abs(float64(i-230))) // builds up, then drains
		}
		tr.Outbox = append(tr.Outbox, outbox)
		tr.Requests = append(tr.Requests, 5+3*math.Sin(float64(i)/20))
		tr.Commands = append(tr.Commands, float64(1+i%30/10))
		tr.Events = append(tr.Events, 2)
		tr.RowsPending = append(tr.RowsPending, i%50/10)
		peers, broker := 2, "connected"
		switch {
		case i >= 150 && i < 166:
			peers, broker = 0, "offline"
		case i >= 166 && i < 168:
			peers, broker = 1, "connecting"
		}
		tr.PeersUp = append(tr.PeersUp, peers)
		tr.Broker = append(tr.Broker, broker)
	}
	b, err := json.Marshal(tr)
	if err != nil {
		t.Fatal(err)
	}
	var trendsJSON atomic.Value // the handler's goroutines read it
	trendsJSON.Store(b)
	status := `{"node":"attic","version":"v1","broker":{"state":"connected"},"peers":[]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Content-Security-Policy", csp)
			_, _ = w.Write(pageHTML)
		case "/status":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, status)
		case "/trends":
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(trendsJSON.Load().([]byte))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()

	page := renderPage(t, srv.URL+"/")
	for _, id := range []string{"trend-outbox", "trend-messages", "trend-rows", "trend-peers", "trend-broker"} {
		if got := chartPoints(t, page, id); got != n {
			t.Errorf("chart #%s: drew %d samples, want %d", id, got, n)
		}
	}
	for _, series := range []string{"outbox", "requests", "commands", "events", "rows pending", "peers up"} {
		if !page.has(`data-series="` + series + `" data-points="` + strconv.Itoa(n) + `"`) {
			t.Errorf("no line of %s with %d points on the page", series, n)
		}
	}
	// connected, offline, connecting, connected again.
	if got := page.attr(t, "trend-broker", "data-segments"); got != "4" {
		t.Errorf("broker timeline: %s bands, want 4", got)
	}
	for _, state := range []string{"connected", "offline", "connecting"} {
		if !page.has(`data-state="` + state + `"`) {
			t.Errorf("broker timeline lacks a band of %s", state)
		}
	}
	if got := page.text(t, "trends-summary"); !strings.Contains(got, "360 samples") || !strings.Contains(got, "30m") {
		t.Errorf("trends summary: %q, want 30 minutes of 360 samples", got)
	}
	if got := page.text(t, "trend-peers-now"); got != "2" {
		t.Errorf("peers up now: got %q, want 2", got)
	}
	if page.attr(t, "banner", "class") == "on" {
		t.Errorf("banner shown: %q", page.text(t, "banner"))
	}

	// The picture: the lines (the page's accent color) and the offline
	// band (its red) are drawn.
	img, _ := screenshot(t, srv.URL+"/", 1280, 1400)
	if got := countColor(img, [3]uint8{0x2f, 0x5f, 0xb3}); got < 800 {
		t.Errorf("screenshot: %d pixels of the lines' color, want the lines drawn (at least 800)", got)
	}
	if got := countColor(img, [3]uint8{0xc0, 0x27, 0x1d}); got < 100 {
		t.Errorf("screenshot: %d pixels of the offline band's red, want it drawn (at least 100)", got)
	}

	// A node that has no history yet, or an older one without /trends:
	// the charts say so, and nothing is alarmed.
	trendsJSON.Store([]byte(`{"every_seconds":5,"at":[]}`))
	page = renderPage(t, srv.URL+"/")
	if chartPoints(t, page, "trend-outbox") != 0 || !page.has("no history yet") || page.attr(t, "banner", "class") == "on" {
		t.Errorf("no history: the charts do not say so quietly")
	}
}
