package meshtest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Proxy is a TCP proxy between a node and a service (broker or database),
// the seam for link faults: cut the link, stall it (a half-open connection
// that carries nothing), and restore it. It runs Toxiproxy in-process.
type Proxy struct {
	mu    sync.Mutex
	p     *toxiproxy.Proxy
	addr  string
	cut   bool
	stall bool
}

var (
	toxiServerOnce sync.Once
	toxiServer     *toxiproxy.ApiServer
)

// NewProxy starts a proxy on a free loopback port that forwards to upstream
// (host:port). It is stopped in cleanup.
func NewProxy(tb testing.TB, upstream string) *Proxy {
	tb.Helper()
	toxiServerOnce.Do(func() {
		toxiServer = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	})
	name := uniqueName(tb.Name(), '-', 60)
	p := toxiproxy.NewProxy(toxiServer, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		tb.Fatalf("proxy to %s: %v", upstream, err)
	}
	px := &Proxy{p: p, addr: p.Listen}
	tb.Cleanup(func() { p.Stop() })
	return px
}

// Addr is the proxy's listen address (host:port), stable across Cut and
// Restore.
func (px *Proxy) Addr() string { return px.addr }

// Rewrite returns rawURL with its host:port replaced by the proxy's.
func (px *Proxy) Rewrite(rawURL, upstream string) string {
	return strings.Replace(rawURL, upstream, px.addr, 1)
}

// Cut closes every connection through the proxy and refuses new ones until
// Restore.
func (px *Proxy) Cut(tb testing.TB) {
	tb.Helper()
	px.mu.Lock()
	defer px.mu.Unlock()
	if !px.cut {
		px.p.Stop()
		px.cut = true
	}
}

// Stall keeps connections open but carries no data, in either direction:
// what a dead link looks like to TCP before a timeout notices.
func (px *Proxy) Stall(tb testing.TB) {
	tb.Helper()
	px.mu.Lock()
	defer px.mu.Unlock()
	if px.stall {
		return
	}
	for _, dir := range []string{"upstream", "downstream"} {
		body := `{"name":"stall-` + dir + `","type":"timeout","stream":"` + dir + `","toxicity":1,"attributes":{"timeout":0}}`
		if _, err := px.p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
			tb.Fatalf("stall proxy: %v", err)
		}
	}
	px.stall = true
}

// Delay adds each to every chunk of data in both directions, so a round
// trip through the proxy takes 2 x each longer: a WAN link's latency.
// It stays across Cut, Stall and Restore; Delay(tb, 0) removes it.
func (px *Proxy) Delay(tb testing.TB, each time.Duration) {
	tb.Helper()
	px.shape(tb, "delay", "latency", each > 0, fmt.Sprintf(`{"latency":%d}`, each.Milliseconds()))
}

// Bandwidth limits the link to bitsPerSec in each direction (rounded
// down to whole kB/s, at least 1): a home uplink. It stays across Cut,
// Stall and Restore; Bandwidth(tb, 0) removes the limit.
func (px *Proxy) Bandwidth(tb testing.TB, bitsPerSec int64) {
	tb.Helper()
	px.shape(tb, "bandwidth", "bandwidth", bitsPerSec > 0, fmt.Sprintf(`{"rate":%d}`, max(1, bitsPerSec/8000)))
}

// shape replaces the toxic named name in both directions by one of kind
// with attrs, or only removes it when !on.
func (px *Proxy) shape(tb testing.TB, name, kind string, on bool, attrs string) {
	tb.Helper()
	px.mu.Lock()
	defer px.mu.Unlock()
	for _, dir := range []string{"upstream", "downstream"} {
		_ = px.p.Toxics.RemoveToxic(context.Background(), name+"-"+dir)
		if !on {
			continue
		}
		body := `{"name":"` + name + "-" + dir + `","type":"` + kind + `","stream":"` + dir + `","toxicity":1,"attributes":` + attrs + `}`
		if _, err := px.p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
			tb.Fatalf("%s on proxy: %v", name, err)
		}
	}
}

// Restore undoes Cut and Stall (not Delay or Bandwidth).
func (px *Proxy) Restore(tb testing.TB) {
	tb.Helper()
	px.mu.Lock()
	defer px.mu.Unlock()
	if px.stall {
		for _, dir := range []string{"upstream", "downstream"} {
			if err := px.p.Toxics.RemoveToxic(context.Background(), "stall-"+dir); err != nil {
				tb.Fatalf("restore proxy: %v", err)
			}
		}
		px.stall = false
	}
	if px.cut {
		if err := px.p.Start(); err != nil {
			tb.Fatalf("restore proxy: %v", err)
		}
		px.cut = false
	}
}
