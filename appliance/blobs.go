package appliance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshbox/meshbox/appliance/blobs"
	"github.com/prometheus/client_golang/prometheus"
)

// BlobsConfig is the node's blob store: a JetStream object store in the
// embedded NATS server (package blobs), its files in the data directory.
type BlobsConfig struct {
	// Enabled runs JetStream and the blob store. Off, the node has no
	// blobs and none of JetStream's idle cost (see the README).
	Enabled bool `json:"enabled"`
	// MaxBytes bounds what the blobs take together: past it the oldest are
	// deleted. JetStream's own limit on the node is twice this, room for
	// one more blob while retention catches up.
	MaxBytes int64 `json:"max_bytes"`
	// MaxAge deletes a blob this long after it was stored (0: never).
	MaxAge Duration `json:"max_age"`
}

// Blob store bounds.
const (
	minBlobBytes = 1 << 20
	maxBlobBytes = 1 << 40
	minBlobAge   = time.Second
)

func defaultBlobsConfig() BlobsConfig {
	return BlobsConfig{Enabled: true, MaxBytes: blobs.DefaultMaxBytes}
}

func (b BlobsConfig) validate(bad func(field, format string, args ...any)) {
	if b.MaxBytes < minBlobBytes || b.MaxBytes > maxBlobBytes {
		bad("blobs.max_bytes", "%d is out of range 1 MiB..1 TiB", b.MaxBytes)
	}
	if b.MaxAge != 0 && b.MaxAge.D() < minBlobAge {
		bad("blobs.max_age", "%s is below the minimum of 1s (0: never)", b.MaxAge)
	}
}

// limits are the store's retention.
func (b BlobsConfig) limits() blobs.Limits {
	return blobs.Limits{MaxBytes: b.MaxBytes, MaxAge: b.MaxAge.D()}
}

// BlobsStatus is the blob store part of the status: what the store
// holds, what the node served of it, and the fetches its clients run
// (in progress, then the last ones that ended), as they report them.
type BlobsStatus struct {
	blobs.Usage
	MaxBytes int64               `json:"max_bytes"`
	MaxAge   string              `json:"max_age,omitempty"`
	Served   blobs.Served        `json:"served"`
	Fetches  []blobs.FetchStatus `json:"fetches,omitempty"`
}

// startBlobs binds the blob store if it exists and serves the blob
// capabilities and blobs.SubjectOpen on a connection of the node's own (not a host the
// watcher of local interest counts). a.mu is held.
func (a *Appliance) startBlobs(ctx context.Context) error {
	if !a.cfg.Blobs.Enabled {
		return nil
	}
	r := a.parts()
	nc, err := r.nats.Connect(ownConnPrefix + "blobs")
	if err != nil {
		return fmt.Errorf("blobs: nats connect: %w", err)
	}
	r.interest.exclude(nc)
	a.update(func(r *running) { r.blobConn = nc })
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The store is made when first used (blobs.SubjectOpen): until then
	// JetStream has no stream, and costs an idle node nothing. One made
	// before gets the limits configured now.
	store, err := blobs.Bind(ctx, nc)
	switch {
	case errors.Is(err, blobs.ErrNoStore):
		store = nil
	case err != nil:
		return err
	default:
		if store, err = blobs.Open(ctx, nc, a.cfg.Blobs.limits()); err != nil {
			return err
		}
	}
	srv, err := blobs.NewServer(blobs.ServerConfig{
		Conn: nc, Store: store, Limits: a.cfg.Blobs.limits(),
		Replies: r.replies.Conn(), ReplyAllowed: r.nats.Rights().ReplyAllowed,
		Logger: a.logger.With("component", "blobs"),
	})
	if err != nil {
		return err
	}
	a.update(func(r *running) { r.blobs = srv })
	return nil
}

// stopBlobs stops serving blobs. a.mu is held.
func (a *Appliance) stopBlobs() {
	if srv := a.parts().blobs; srv != nil {
		a.update(func(r *running) { r.blobs = nil })
		srv.Close()
	}
	if nc := a.parts().blobConn; nc != nil {
		a.update(func(r *running) { r.blobConn = nil })
		nc.Close()
	}
}

// blobsStatus is the blob store's part of the status (nil before it runs).
func (a *Appliance) blobsStatus() *BlobsStatus {
	srv := a.parts().blobs
	if srv == nil {
		return nil
	}
	st := &BlobsStatus{Usage: srv.Usage(), MaxBytes: a.cfg.Blobs.MaxBytes, Served: srv.Served()}
	st.Fetches, _ = srv.Fetches()
	if a.cfg.Blobs.MaxAge != 0 {
		st.MaxAge = a.cfg.Blobs.MaxAge.String()
	}
	return st
}

// The blob store's metrics, read from the server at each scrape.
var (
	descBlobs       = prometheus.NewDesc("meshbox_blobs", "Blobs in the node's blob store.", nil, nil)
	descBlobsBytes  = prometheus.NewDesc("meshbox_blobs_bytes", "Bytes of the blobs in the node's blob store.", nil, nil)
	descBlobsPruned = prometheus.NewDesc("meshbox_blobs_pruned_total", "Blobs deleted because the store passed blobs.max_bytes.", nil, nil)
	descBlobReqs    = prometheus.NewDesc("meshbox_blob_requests_total",
		"Blob requests the node took (kind open, manifest, chunk, fetch_report), by outcome: ok, expired (a chunk request whose deadline passed before a reader was free), bad_input, not_found, error, full.",
		[]string{"kind", "outcome"}, nil)
	descBlobServed     = prometheus.NewDesc("meshbox_blob_served_bytes_total", "Bytes of chunks the node served.", nil, nil)
	descBlobFetchBytes = prometheus.NewDesc("meshbox_blob_fetch_bytes_total",
		"Bytes that arrived for the blob fetches of the node's clients (fetched again too), as they report them.", nil, nil)
	descBlobFetchRetries = prometheus.NewDesc("meshbox_blob_fetch_retries_total",
		"Requests the blob fetches of the node's clients asked again, by cause: deadline, unavailable, corrupt.", []string{"cause"}, nil)
	descBlobFetches = prometheus.NewDesc("meshbox_blob_fetches_total",
		"Blob fetches of the node's clients that ended, by outcome: done, a failure's cause, or abandoned (it stopped reporting).", []string{"outcome"}, nil)
	descBlobFetching = prometheus.NewDesc("meshbox_blob_fetches_running", "Blob fetches of the node's clients in progress.", nil, nil)
)

// blobsCollector exports the blob store's usage, what the node served
// and its clients' fetches (nothing while the store does not run).
type blobsCollector struct{ srv func() *blobs.Server }

// Describe implements prometheus.Collector.
func (c blobsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBlobs, descBlobsBytes, descBlobsPruned, descBlobReqs, descBlobServed,
		descBlobFetchBytes, descBlobFetchRetries, descBlobFetches, descBlobFetching} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c blobsCollector) Collect(ch chan<- prometheus.Metric) {
	srv := c.srv()
	if srv == nil {
		return
	}
	u := srv.Usage()
	ch <- prometheus.MustNewConstMetric(descBlobs, prometheus.GaugeValue, float64(u.Count))
	ch <- prometheus.MustNewConstMetric(descBlobsBytes, prometheus.GaugeValue, float64(u.Bytes))
	ch <- prometheus.MustNewConstMetric(descBlobsPruned, prometheus.CounterValue, float64(u.Pruned))
	for k, n := range srv.RequestCounts() {
		ch <- prometheus.MustNewConstMetric(descBlobReqs, prometheus.CounterValue, float64(n), k.Kind, k.Outcome)
	}
	ch <- prometheus.MustNewConstMetric(descBlobServed, prometheus.CounterValue, float64(srv.Served().Bytes))
	_, t := srv.Fetches()
	ch <- prometheus.MustNewConstMetric(descBlobFetchBytes, prometheus.CounterValue, float64(t.Bytes))
	for cause, n := range map[string]int{"deadline": t.Retries.Deadline, "unavailable": t.Retries.Unavailable, "corrupt": t.Retries.Corrupt} {
		ch <- prometheus.MustNewConstMetric(descBlobFetchRetries, prometheus.CounterValue, float64(n), cause)
	}
	for _, o := range blobs.FetchOutcomes {
		ch <- prometheus.MustNewConstMetric(descBlobFetches, prometheus.CounterValue, float64(t.Outcomes[o]), o)
	}
	ch <- prometheus.MustNewConstMetric(descBlobFetching, prometheus.GaugeValue, float64(t.Running))
}
