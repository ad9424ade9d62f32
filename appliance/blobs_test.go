package appliance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance/blobs"
)

// TestBlobsInStatusAndMetrics: a node runs its blob store; the status and
// the metrics show it, empty.
func TestBlobsInStatusAndMetrics(t *testing.T) {
	a := startNode(t, "alpha", t.TempDir())
	st := a.Status().Blobs
	if st == nil || st.Count != 0 || st.MaxBytes != defaultBlobsConfig().MaxBytes {
		t.Fatalf("status blobs: got %+v, want an empty store of %d bytes", st, defaultBlobsConfig().MaxBytes)
	}
	// No stream until the store is first used (JetStream's idle cost).
	nc, err := a.parts().nats.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := blobs.Bind(ctx, nc); !errors.Is(err, blobs.ErrNoStore) {
		t.Fatalf("a new node's blob store: got %v, want ErrNoStore", err)
	}
	if _, err := nc.RequestWithContext(ctx, blobs.SubjectOpen, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := blobs.Bind(ctx, nc); err != nil {
		t.Fatalf("the blob store after %s: %v", blobs.SubjectOpen, err)
	}
	mfs, err := a.tel.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, mf := range mfs {
		found[mf.GetName()] = true
	}
	for _, name := range []string{"meshbox_blobs", "meshbox_blobs_bytes", "meshbox_blobs_pruned_total", "meshbox_blob_served_bytes_total",
		"meshbox_blob_fetch_bytes_total", "meshbox_blob_fetch_retries_total", "meshbox_blob_fetches_total", "meshbox_blob_fetches_running"} {
		if !found[name] {
			t.Errorf("metric %s: missing", name)
		}
	}
}
