package localnats

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance/blobs"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// startBlobNATS runs the embedded server with JetStream and the blob
// store, and local authentication as a node in a mesh (anonymous false)
// or a standalone one (true) has it.
func startBlobNATS(t *testing.T, anonymous bool) (*Server, *localAuth) {
	t.Helper()
	dir := t.TempDir()
	auth, err := newLocalAuth(dir, anonymous)
	if err != nil {
		t.Fatal(err)
	}
	n, err := startNATS("127.0.0.1:0", "alpha", jetStreamDir(dir), blobs.DefaultMaxBytes, auth, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	admin, err := n.Connect("test-admin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := blobs.Open(ctx, admin, blobs.Limits{MaxBytes: blobs.DefaultMaxBytes}); err != nil {
		t.Fatal(err)
	}
	return n, auth
}

// useBlobStore puts and gets an object through nc's object store API.
func useBlobStore(nc *nats.Conn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	obs, err := js.ObjectStore(ctx, blobs.Bucket)
	if err != nil {
		return err
	}
	data := bytes.Repeat([]byte("x"), 300<<10)
	if _, err := obs.PutBytes(ctx, "report", data); err != nil {
		return err
	}
	got, err := obs.GetBytes(ctx, "report")
	if err != nil {
		return err
	}
	if !bytes.Equal(got, data) {
		return errTest("got other bytes than put")
	}
	return nil
}

// makeStream tries to create a stream that captures the node's subjects.
func makeStream(nc *nats.Conn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "spy", Subjects: []string{"$MESH.>", "_INBOX.>"}})
	return err
}

type errTest string

func (e errTest) Error() string { return string(e) }

// TestJetStreamOnlyWithBlobRights: a program reaches the blob store only
// when its definition says blobs, and then only the blob store; no
// client but the node makes streams.
func TestJetStreamOnlyWithBlobRights(t *testing.T) {
	n, auth := startBlobNATS(t, false)
	plain := programs.Program{Name: "plain", Call: []string{"echo"}}
	withBlobs := programs.Program{Name: "store", Blobs: true}
	for _, p := range []programs.Program{plain, withBlobs} {
		if _, err := auth.store.Put(p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := auth.reload(n.srv, n.opts); err != nil {
		t.Fatal(err)
	}
	plainConn, _ := programConn(t, n.URL(), auth.store.CredsPath(plain.Name), plain)
	if err := useBlobStore(plainConn); err == nil {
		t.Error("a program without blob rights used the blob store")
	}
	blobConn, _ := programConn(t, n.URL(), auth.store.CredsPath(withBlobs.Name), withBlobs)
	if err := useBlobStore(blobConn); err != nil {
		t.Errorf("a program with blob rights: %v", err)
	}
	if err := makeStream(blobConn); err == nil {
		t.Error("a program with blob rights made a stream of its own")
	}
}

// TestAnonymousUsesBlobStoreButMakesNoStream: on an open server, clients
// without a credential use the blob store but make no streams.
func TestAnonymousUsesBlobStoreButMakesNoStream(t *testing.T) {
	n, _ := startBlobNATS(t, true)
	nc, err := nats.Connect(n.URL(), nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := useBlobStore(nc); err != nil {
		t.Errorf("anonymous client: %v", err)
	}
	if err := makeStream(nc); err == nil {
		t.Error("an anonymous client made a stream")
	}
}
