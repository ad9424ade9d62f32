package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/blobs"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// The home uplink of TestBlobFetchOverSlowLink.
const (
	slowLinkBits  = 1_000_000 // bits per second, each way
	slowLinkDelay = 25 * time.Millisecond
	slowLinkBlob  = 1 << 20
)

// TestBlobFetchOverSlowLink: alpha serves a blob from behind a home
// uplink (its broker connections through a proxy: 1 Mbit/s and 25 ms
// each way), beta fetches it, both with the default configuration. The
// fetch completes with the right bytes; alpha served every byte of the
// blob once, no request twice, and wrote at most 1.1 x the blob into its
// link; beta's status and metrics show the fetch done, and alpha's what it
// served. At this rate a 256 KiB chunk takes 2.1 s: with four whole chunks
// in flight the fourth reply would come after 8.4 s, past the default
// request deadline (bridge.request_timeout, 5 s), and a chunk asked again
// then would queue behind the late replies still filling the link; the
// fetch passes only if its requests and their deadlines follow the link.
func TestBlobFetchOverSlowLink(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	t.Parallel()
	meshtest.Binary(t) // built before cli's timeout starts
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	db := meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", meshtest.NoCredential(vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	mesh(t, db, "node", "add", "beta", "--record-only")
	upstream := hostOf(t, vhost)
	px := meshtest.NewProxy(t, upstream)
	px.Delay(t, slowLinkDelay)
	px.Bandwidth(t, slowLinkBits)
	tap := meshtest.NewByteTap(t, px.Addr())
	alpha := meshtest.StartProcess(t, "--node", "alpha", "--db", db, "--broker", tap.Rewrite(vhost, upstream))
	beta := meshtest.StartProcess(t, "--node", "beta", "--db", db)
	for _, p := range []*meshtest.Process{alpha, beta} {
		meshtest.WaitStatus(t, p.HTTPURL(), 60*time.Second, p.Node()+" connected to the broker", func(s appliance.Status) bool { return s.Broker.State == "connected" })
		waitSealing(t, p)
	}
	meshtest.WaitStatus(t, beta.HTTPURL(), 60*time.Second, "beta sees alpha up", func(s appliance.Status) bool {
		for _, p := range s.Peers {
			if p.Name == "alpha" && p.State == "up" {
				return true
			}
		}
		return false
	})
	file, sum := randomBlobFile(t, slowLinkBlob)
	ref := putBlob(t, alpha, file, sum)

	served := scrape(t, alpha.HTTPURL())
	out := filepath.Join(t.TempDir(), "fetched")
	tap.Reset()
	start := time.Now()
	code, stdout, errOut := blobCLI(t, beta, 3*time.Minute, "get", ref, "-o", out)
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("blob get over the slow link: exit %d after %s: %s%s", code, took.Round(time.Millisecond), stdout, errOut)
	}
	if got := fileSHA256(t, out); got != sum {
		t.Fatalf("fetched file: got SHA-256 %s, want %s", got, sum)
	}
	s := parseSummary(t, stdout)
	if s.fetched != s.chunks || s.again != 0 || strings.Contains(errOut, "trying again") {
		t.Errorf("fetch summary: got %+v, notes %q; want every chunk once, nothing asked again", s, errOut)
	}
	floor := time.Duration(float64(slowLinkBlob) * 8 / slowLinkBits * float64(time.Second))
	if took > 3*floor {
		t.Errorf("the fetch took %s, want at most 3 x the link's floor of %s", took.Round(time.Millisecond), floor)
	}

	// What alpha served: the blob's bytes once, every request answered,
	// none past its deadline.
	after := scrape(t, alpha.HTTPURL())
	delta := func(name string, labels ...string) float64 {
		a, _ := after.value(name, labels...)
		b, _ := served.value(name, labels...)
		return a - b
	}
	if got := delta("meshbox_blob_served_bytes_total"); got != slowLinkBlob {
		t.Errorf("alpha served %.0f bytes of chunks, want the blob's %d once", got, slowLinkBlob)
	}
	answered := delta("meshbox_blob_requests_total", "kind=chunk", "outcome=ok")
	if expired := delta("meshbox_blob_requests_total", "kind=chunk", "outcome=expired"); expired != 0 {
		t.Errorf("alpha dropped %.0f chunk requests past their deadline, want none", expired)
	}
	// Late bytes would still be on their way: give them a moment.
	time.Sleep(time.Second)
	up := tap.Up()
	t.Logf("%d KiB over %d kbit/s, %s each way: %s (floor %s), %.0f chunk requests answered, %d bytes into alpha's link (%.3f x the blob)",
		slowLinkBlob>>10, slowLinkBits/1000, slowLinkDelay, took.Round(time.Millisecond), floor, answered, up, float64(up)/slowLinkBlob)
	if float64(up) > 1.1*slowLinkBlob {
		t.Errorf("alpha wrote %d bytes into its link for a blob of %d, want at most 1.1 x", up, slowLinkBlob)
	}

	// beta shows the fetch it ran, and counts it.
	st := meshtest.WaitStatus(t, beta.HTTPURL(), 10*time.Second, "beta's status showing the fetch done", func(s appliance.Status) bool {
		return s.Blobs != nil && len(s.Blobs.Fetches) == 1 && s.Blobs.Fetches[0].State == blobs.StateDone
	})
	if f := st.Blobs.Fetches[0]; f.Ref != ref || f.Have != slowLinkBlob || f.Bytes != slowLinkBlob || float64(f.Requests) != answered || f.Rate <= 0 {
		t.Errorf("beta's status: got %+v, want %s done, %d bytes, %.0f requests", f, ref, slowLinkBlob, answered)
	}
	ms := scrape(t, beta.HTTPURL())
	if v := ms.must(t, "meshbox_blob_fetch_bytes_total"); v != slowLinkBlob {
		t.Errorf("beta meshbox_blob_fetch_bytes_total: got %v, want %d", v, slowLinkBlob)
	}
	if v := ms.must(t, "meshbox_blob_fetches_total", "outcome=done"); v != 1 {
		t.Errorf("beta meshbox_blob_fetches_total{outcome=done}: got %v, want 1", v)
	}
	for _, cause := range []string{"deadline", "unavailable", "corrupt"} {
		if v := ms.must(t, "meshbox_blob_fetch_retries_total", "cause="+cause); v != 0 {
			t.Errorf("beta meshbox_blob_fetch_retries_total{cause=%s}: got %v, want 0", cause, v)
		}
	}
}
