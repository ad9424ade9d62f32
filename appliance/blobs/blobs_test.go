package blobs

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshbox/meshbox/testing/meshtest/natstest"
	"github.com/meshbox/meshbox/testing/wait"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// testNode is a NATS server with JetStream, the blob store and server on
// it, and a stand-in for the bridge: node.<node>.cap.X is answered by
// cap.X, as the bridge does for the node's own name.
type testNode struct {
	nc    *nats.Conn
	store *Store
	srv   *Server
}

func startTestNode(t *testing.T, lim Limits) *testNode {
	t.Helper()
	ns := natstest.Start(t, func(o *server.Options) {
		o.JetStream = true
		o.StoreDir = t.TempDir()
	})
	nc := natstest.Connect(t, ns)
	ctx := context.Background()
	store, err := Open(ctx, nc, lim)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ServerConfig{Conn: nc, Store: store, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	relay := natstest.Connect(t, ns)
	if _, err := relay.Subscribe("node.self.cap.>", func(m *nats.Msg) {
		name := m.Subject[len("node.self.cap."):]
		resp, err := relay.Request("cap."+name, m.Data, 5*time.Second)
		if err != nil {
			return
		}
		_ = m.RespondMsg(&nats.Msg{Header: resp.Header, Data: resp.Data})
	}); err != nil {
		t.Fatal(err)
	}
	if err := relay.Flush(); err != nil {
		t.Fatal(err)
	}
	return &testNode{nc: nc, store: store, srv: srv}
}

// randomFile writes n random bytes into a file and returns its path,
// content and SHA-256.
func randomFile(t *testing.T, n int) (string, []byte, string) {
	t.Helper()
	data := make([]byte, n)
	_, _ = rand.Read(data)
	path := filepath.Join(t.TempDir(), "in.bin")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return path, data, hex.EncodeToString(sum[:])
}

func checkFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: got %d bytes that differ from the %d put", path, len(got), len(want))
	}
}

func TestPutAndFetch(t *testing.T) {
	n := startTestNode(t, Limits{MaxBytes: 64 << 20})
	ctx := context.Background()
	for _, size := range []int{0, 1, ChunkSize, 5*ChunkSize + 12345} {
		path, data, sum := randomFile(t, size)
		info, err := n.store.PutFile(ctx, path, 0)
		if err != nil {
			t.Fatal(err)
		}
		if info.SHA256 != sum || info.Size != int64(size) {
			t.Fatalf("put %d bytes: got %+v, want sha256 %s", size, info, sum)
		}
		out := filepath.Join(t.TempDir(), "out.bin")
		res, err := (&Fetcher{Conn: n.nc}).Fetch(ctx, Ref{"self", sum}, out)
		if err != nil {
			t.Fatalf("fetch %d bytes: %v", size, err)
		}
		checkFile(t, out, data)
		if res.Chunks != chunksOf(int64(size)) || res.Fetched != res.Chunks || res.Refetched != 0 {
			t.Errorf("fetch %d bytes: got %+v", size, res)
		}
		if _, err := os.Stat(out + PartSuffix); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the partial file is left after a complete fetch: %v", err)
		}
	}
}

// TestCorruptChunkIsFetchedAgain corrupts chunks as they arrive: the first
// arrival of two chunks is fetched again and the file is right; a chunk
// that always arrives corrupted fails the fetch.
func TestCorruptChunkIsFetchedAgain(t *testing.T) {
	n := startTestNode(t, Limits{MaxBytes: 64 << 20})
	ctx := context.Background()
	path, data, sum := randomFile(t, 6*ChunkSize+7)
	if _, err := n.store.PutFile(ctx, path, 0); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	left := map[int]bool{1: true, 4: true}
	f := &Fetcher{Conn: n.nc, Tamper: func(i int, b []byte) {
		mu.Lock()
		defer mu.Unlock()
		if left[i] {
			delete(left, i)
			b[0] ^= 1
		}
	}}
	out := filepath.Join(t.TempDir(), "out.bin")
	res, err := f.Fetch(ctx, Ref{"self", sum}, out)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, out, data)
	if res.Refetched != 2 || res.Fetched != res.Chunks+2 {
		t.Errorf("got %+v, want 2 chunks fetched again", res)
	}

	f.Tamper = func(i int, b []byte) {
		if i == 3 {
			b[len(b)-1] ^= 0x80
		}
	}
	out2 := filepath.Join(t.TempDir(), "out2.bin")
	if _, err := f.Fetch(ctx, Ref{"self", sum}, out2); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a chunk always corrupted: got %v, want ErrCorrupt", err)
	}
	if _, err := os.Stat(out2); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a corrupt fetch left %s: %v", out2, err)
	}
}

// TestFetchContinuesPartialFile keeps the chunks of a .part file that
// verify and fetches the rest, a damaged chunk among them.
func TestFetchContinuesPartialFile(t *testing.T) {
	n := startTestNode(t, Limits{MaxBytes: 64 << 20})
	ctx := context.Background()
	path, data, sum := randomFile(t, 8*ChunkSize+100)
	if _, err := n.store.PutFile(ctx, path, 0); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out.bin")
	part := bytes.Clone(data[:5*ChunkSize+10])
	part[2*ChunkSize+5] ^= 1 // chunk 2 damaged
	if err := os.WriteFile(out+PartSuffix, part, 0o600); err != nil {
		t.Fatal(err)
	}
	var notes []string
	f := &Fetcher{Conn: n.nc, Note: func(format string, args ...any) { notes = append(notes, format) }}
	res, err := f.Fetch(ctx, Ref{"self", sum}, out)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, out, data)
	// Chunks 0, 1, 3, 4 verify; 2 is damaged; 5 is short.
	if res.Kept != 4 || res.Fetched != res.Chunks-4 {
		t.Errorf("got %+v, want 4 chunks kept and %d fetched", res, res.Chunks-4)
	}
	if len(notes) == 0 || !strings.Contains(notes[0], "continuing") {
		t.Errorf("notes %q: want one saying the fetch continues", notes)
	}
}

func TestFetchMissingBlob(t *testing.T) {
	n := startTestNode(t, Limits{MaxBytes: 64 << 20})
	ctx := context.Background()
	path, _, sum := randomFile(t, 1000)
	if _, err := n.store.PutFile(ctx, path, 0); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out.bin")
	if _, err := (&Fetcher{Conn: n.nc}).Fetch(ctx, Ref{"self", sum}, out); err != nil {
		t.Fatal(err)
	}
	if err := n.store.Remove(ctx, sum); err != nil {
		t.Fatal(err)
	}
	_, err := (&Fetcher{Conn: n.nc}).Fetch(ctx, Ref{"self", sum}, out+"2")
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("fetch of a removed blob: got %v, want ErrNotFound", err)
	}
	if err := n.store.Remove(ctx, sum); !errors.Is(err, ErrNotFound) {
		t.Fatalf("remove twice: got %v, want ErrNotFound", err)
	}
}

// TestBlobPutByAnotherClient finds a blob an object store client put
// under a name of its own, by its digest.
func TestBlobPutByAnotherClient(t *testing.T) {
	n := startTestNode(t, Limits{MaxBytes: 64 << 20})
	ctx := context.Background()
	js, err := jetstream.New(n.nc)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := js.ObjectStore(ctx, Bucket)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("report line\n"), 50000)
	if _, err := obs.PutBytes(ctx, "report.txt", data); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	hexSum := hex.EncodeToString(sum[:])
	info, err := n.store.Stat(ctx, hexSum)
	if err != nil || info.Name != "report.txt" {
		t.Fatalf("stat by digest: got %+v, %v", info, err)
	}
	out := filepath.Join(t.TempDir(), "out.txt")
	if _, err := (&Fetcher{Conn: n.nc}).Fetch(ctx, Ref{"self", hexSum}, out); err != nil {
		t.Fatal(err)
	}
	checkFile(t, out, data)
}

// TestRetentionDeletesOldestFirst puts blobs beyond the size limit: the
// keeper deletes the oldest until the rest fit.
func TestRetentionDeletesOldestFirst(t *testing.T) {
	const each = 400 << 10
	n := startTestNode(t, Limits{MaxBytes: 3*each + each/2})
	ctx := context.Background()
	var sums []string
	for range 5 {
		path, _, sum := randomFile(t, each)
		if _, err := n.store.PutFile(ctx, path, 0); err != nil {
			t.Fatal(err)
		}
		sums = append(sums, sum)
	}
	wait.Eventually(t, 10*time.Second, "the newest three blobs kept, two pruned", func() error {
		list, err := n.store.List(ctx)
		if err != nil {
			return err
		}
		var got []string
		for _, b := range list {
			got = append(got, b.SHA256)
		}
		if u := n.srv.Usage(); strings.Join(got, ",") != strings.Join(sums[2:], ",") || u.Pruned != 2 || u.Count != 3 {
			return fmt.Errorf("got %v, want %v; usage %+v, want 2 pruned, 3 kept", got, sums[2:], u)
		}
		return nil
	})
}
