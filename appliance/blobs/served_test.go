package blobs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/wait"
	"github.com/nats-io/nats.go"
)

// askChunk asks the test node's server for req, with the deadline
// header timeout ("": none).
func askChunk(t *testing.T, n *testNode, req ChunkRequest, timeout string) (*nats.Msg, error) {
	t.Helper()
	body, _ := json.Marshal(req)
	msg := nats.NewMsg(subjChunk)
	msg.Data = body
	if timeout != "" {
		msg.Header.Set(wire.HeaderTimeout, timeout)
	}
	return n.nc.RequestMsg(msg, 2*time.Second)
}

// TestChunkParts: a node's manifest says it serves parts of chunks, and
// it serves any part within a chunk; a part beyond it, or a bad offset,
// length or deadline, is bad input.
func TestChunkParts(t *testing.T) {
	n := startTestNode(t, Limits{MaxBytes: 64 << 20})
	ctx := context.Background()
	path, data, sum := randomFile(t, 2*ChunkSize+1000)
	if _, err := n.store.PutFile(ctx, path, 0); err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(ManifestRequest{SHA256: sum})
	resp, err := n.nc.Request(subjManifest, body, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var man Manifest
	if err := json.Unmarshal(resp.Data, &man); err != nil || !man.Ranges {
		t.Fatalf("manifest: got %s (%v), want ranges true", resp.Data, err)
	}
	for _, tt := range []struct {
		req  ChunkRequest
		want []byte
	}{
		{ChunkRequest{SHA256: sum, Index: 1}, data[ChunkSize : 2*ChunkSize]},
		{ChunkRequest{SHA256: sum, Index: 1, Offset: 100, Length: 4096}, data[ChunkSize+100 : ChunkSize+4196]},
		{ChunkRequest{SHA256: sum, Index: 0, Offset: ChunkSize - 10}, data[ChunkSize-10 : ChunkSize]},
		{ChunkRequest{SHA256: sum, Index: 2, Offset: 999, Length: 1}, data[2*ChunkSize+999:]},
	} {
		m, err := askChunk(t, n, tt.req, "30s")
		if err != nil {
			t.Fatalf("%+v: %v", tt.req, err)
		}
		if se := wire.ErrorOf(m.Header); se != nil || !bytes.Equal(m.Data, tt.want) {
			t.Errorf("%+v: got %d bytes (error %v), want %d bytes of the blob", tt.req, len(m.Data), se, len(tt.want))
		}
	}
	for _, tt := range []struct {
		req     ChunkRequest
		timeout string
	}{
		{ChunkRequest{SHA256: sum, Index: 2, Offset: 999, Length: 2}, ""}, // beyond the last chunk's 1000 bytes
		{ChunkRequest{SHA256: sum, Index: 2, Offset: 1000}, ""},
		{ChunkRequest{SHA256: sum, Index: 0, Offset: -1}, ""},
		{ChunkRequest{SHA256: sum, Index: 0, Length: ChunkSize + 1}, ""},
		{ChunkRequest{SHA256: sum, Index: 0, Offset: ChunkSize}, ""},
		{ChunkRequest{SHA256: sum, Index: 0}, "soon"},
		{ChunkRequest{SHA256: sum, Index: 0}, "-3s"},
	} {
		m, err := askChunk(t, n, tt.req, tt.timeout)
		if err != nil {
			t.Fatalf("%+v (timeout %q): %v", tt.req, tt.timeout, err)
		}
		if se := wire.ErrorOf(m.Header); se == nil || se.Code != CodeBadInput {
			t.Errorf("%+v (timeout %q): got %v, want 400", tt.req, tt.timeout, se)
		}
	}
	if got := n.srv.RequestCounts()[RequestKey{KindChunk, OutcomeBadInput}]; got != 7 {
		t.Errorf("chunk requests counted as bad input: got %d, want 7", got)
	}
	if st := n.srv.Served(); st.Chunks != 4 || st.Bytes != ChunkSize+4096+10+1 {
		t.Errorf("served: got %+v, want 4 chunk requests of %d bytes", st, ChunkSize+4096+10+1)
	}
}

// TestChunkRequestPastItsDeadline: a chunk request whose deadline passed
// before a reader took it is dropped, unanswered (its caller gave up),
// and counted.
func TestChunkRequestPastItsDeadline(t *testing.T) {
	n := startTestNode(t, Limits{MaxBytes: 64 << 20})
	ctx := context.Background()
	path, _, sum := randomFile(t, 1000)
	if _, err := n.store.PutFile(ctx, path, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := askChunk(t, n, ChunkRequest{SHA256: sum}, "1ns"); !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("a request past its deadline: got %v, want no answer", err)
	}
	if got := n.srv.RequestCounts()[RequestKey{KindChunk, OutcomeExpired}]; got != 1 {
		t.Errorf("expired chunk requests: got %d, want 1", got)
	}
	if st := n.srv.Served(); st.Expired != 1 || st.Chunks != 0 {
		t.Errorf("served: got %+v, want 1 expired, none answered", st)
	}
}

// TestFetchIsReported: a fetch reports its progress to the local node,
// which shows it ended, with its bytes, and counts it.
func TestFetchIsReported(t *testing.T) {
	n := startTestNode(t, Limits{MaxBytes: 64 << 20})
	ctx := context.Background()
	path, _, sum := randomFile(t, 3*ChunkSize+5)
	if _, err := n.store.PutFile(ctx, path, 0); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out.bin")
	res, err := (&Fetcher{Conn: n.nc}).Fetch(ctx, Ref{"self", sum}, out)
	if err != nil {
		t.Fatal(err)
	}
	wait.Eventually(t, 5*time.Second, "the fetch shown done", func() error {
		fs, tot := n.srv.Fetches()
		if len(fs) != 1 || fs[0].State != StateDone || fs[0].Have != res.Size || fs[0].Bytes != res.Bytes || fs[0].Requests != res.Requests {
			return fmt.Errorf("fetches %+v, want one done with %+v", fs, res)
		}
		if fs[0].Seconds <= 0 || fs[0].Elapsed() <= 0 {
			return fmt.Errorf("fetch %+v: want the fetch's own time (seconds > 0)", fs[0])
		}
		if tot.Bytes != res.Bytes || tot.Outcomes[StateDone] != 1 || tot.Running != 0 {
			return fmt.Errorf("totals %+v, want %d bytes, one done", tot, res.Bytes)
		}
		return nil
	})
	// A fetch of a blob the node lacks fails and is counted under its cause.
	if _, err := (&Fetcher{Conn: n.nc}).Fetch(ctx, Ref{"self", sha256Hex("none")}, out+"2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("fetch of a missing blob: got %v, want ErrNotFound", err)
	}
	wait.Eventually(t, 5*time.Second, "the failed fetch counted", func() error {
		fs, tot := n.srv.Fetches()
		if tot.Outcomes[CauseNotFound] != 1 || len(fs) != 2 || fs[1].State != StateFailed || fs[1].Cause != CauseNotFound {
			return fmt.Errorf("fetches %+v, totals %+v: want a second one failed, not_found", fs, tot)
		}
		return nil
	})
	// NoReport: nothing new.
	if _, err := (&Fetcher{Conn: n.nc, NoReport: true}).Fetch(ctx, Ref{"self", sum}, out+"3"); err != nil {
		t.Fatal(err)
	}
	if err := n.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := n.srv.RequestCounts()[RequestKey{KindFetchReport, OutcomeOK}]; got < 2 {
		t.Errorf("reports counted: got %d, want at least 2", got)
	}
	if fs, _ := n.srv.Fetches(); len(fs) != 2 {
		t.Errorf("fetches after one with NoReport: got %d, want 2", len(fs))
	}
}

// TestFetchFromOwnerWithoutParts: an owner whose manifest does not say
// ranges (a node of an older meshbox) is asked for whole chunks only,
// and the fetch is right.
func TestFetchFromOwnerWithoutParts(t *testing.T) {
	n := startTestNode(t, Limits{MaxBytes: 64 << 20})
	ctx := context.Background()
	path, data, sum := randomFile(t, 3*ChunkSize+77)
	if _, err := n.store.PutFile(ctx, path, 0); err != nil {
		t.Fatal(err)
	}
	// The older owner, on node "old": no ranges in its manifest, and any
	// part asked for is refused.
	parts := make(chan ChunkRequest, 16)
	if _, err := n.nc.Subscribe("node.old.cap.>", func(m *nats.Msg) {
		name := m.Subject[len("node.old.cap."):]
		if name == CapChunk {
			var req ChunkRequest
			_ = json.Unmarshal(m.Data, &req)
			if req.Offset != 0 || req.Length != 0 {
				parts <- req
			}
		}
		resp, err := n.nc.Request("cap."+name, m.Data, 5*time.Second)
		if err != nil {
			return
		}
		body := resp.Data
		if name == CapManifest {
			var man Manifest
			if json.Unmarshal(body, &man) == nil {
				man.Ranges = false
				body, _ = json.Marshal(man)
			}
		}
		_ = m.RespondMsg(&nats.Msg{Header: resp.Header, Data: body})
	}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out.bin")
	res, err := (&Fetcher{Conn: n.nc}).Fetch(ctx, Ref{"old", sum}, out)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, out, data)
	if res.Requests != res.Chunks || res.Fetched != res.Chunks {
		t.Errorf("got %+v, want one request per chunk", res)
	}
	select {
	case req := <-parts:
		t.Errorf("asked an owner without ranges for a part: %+v", req)
	default:
	}
}
