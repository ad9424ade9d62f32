package blobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/meshbox/meshbox/internal/backoff"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
)

// Fetch defaults.
const (
	// DefaultWindow is how many whole chunks a fetch has in flight at
	// most, on a fast link; a slower one has fewer bytes in flight (flow).
	DefaultWindow = 4
	// DefaultPatience is how long a fetch that has begun keeps trying
	// while nothing arrives (the broker restarting, say).
	DefaultPatience = 2 * time.Minute
	// chunkAttempts bounds the fetches of one chunk that arrives
	// corrupted.
	chunkAttempts = 5
	// localGrace is how much longer than a request's deadline a fetch
	// waits for the node's own answer (its 504) before it gives up on the
	// request itself.
	localGrace = time.Second
	// PartSuffix ends the name of a fetch's partial file.
	PartSuffix = ".part"
)

// Fetcher fetches blobs from any node of the mesh through the local
// node's NATS server (conn): it asks the owner for the manifest, then for
// the chunks (or parts of them), verifies each chunk against its hash
// (fetching a corrupted one again) and the whole file against the blob's
// SHA-256. How much it has in flight, how large its requests are and each
// request's deadline follow the rate it measures (flow): a slow link makes
// a slow fetch, not a failed one. It writes into <path>.part and renames
// it to path once verified; a fetch that finds a .part file keeps the
// chunks in it that verify. Unless NoReport, it reports its progress to
// the local node (SubjectFetches), which shows it in its status.
type Fetcher struct {
	Conn     *nats.Conn
	Window   int           // whole chunks in flight at most (0: DefaultWindow)
	Patience time.Duration // 0: DefaultPatience
	// Progress, when set, is called as data arrives with the bytes the
	// file holds and the blob's size.
	Progress func(have, size int64)
	// Note, when set, is told what the fetch does besides fetching: chunks
	// kept from a partial file, a chunk fetched again, a retry.
	Note func(format string, args ...any)
	// NoReport turns off the progress reports to the local node.
	NoReport bool
	// Tamper is a test seam: called with each reply as it arrives (the
	// chunk, or the part of it asked for), before it is verified.
	Tamper func(index int, data []byte)
}

// Result is what a fetch did.
type Result struct {
	Size      int64
	Chunks    int
	Kept      int     // chunks found verified in a partial file
	Fetched   int     // chunks that arrived whole, verified or not
	Refetched int     // chunks fetched again after failing verification
	Retries   int     // requests tried again after a transient failure
	TimedOut  int     // of Retries, the ones whose deadline passed
	Requests  int     // requests answered
	Bytes     int64   // bytes that arrived, the ones fetched again too
	Rate      float64 // bytes per second, as last measured
}

// ServiceError is an error reply of a node (or of the bridge on the way).
type ServiceError = wire.ServiceError

// transient says whether a failed request is worth trying again within a
// fetch that has begun: the mesh or the owner was away for a moment, or
// the deadline passed.
func transient(err error) bool {
	var se *ServiceError
	if errors.As(err, &se) {
		return wire.Transient(se.Code)
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

// timedOut says whether a request failed because its deadline passed (the
// bridge's 504, or no answer at all by then).
func timedOut(err error) bool {
	var se *ServiceError
	if errors.As(err, &se) {
		return se.Code == wire.CodeTimeout
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

// Fetch fetches the blob ref into the file path.
func (f *Fetcher) Fetch(ctx context.Context, ref Ref, path string) (res Result, err error) {
	fl := newFlow(f.window() * ChunkSize)
	rep := f.newReporter(ref, fl, &res)
	defer func() { rep.end(err) }()
	man, hashes, err := f.manifest(ctx, ref, fl)
	if err != nil {
		return res, err
	}
	res.Size, res.Chunks = man.Size, man.Chunks
	part := path + PartSuffix
	file, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return res, fmt.Errorf("fetch: %w", err)
	}
	defer file.Close()
	have, err := verifyPart(file, man.Size, hashes)
	if err != nil {
		return res, fmt.Errorf("fetch: %s: %w", part, err)
	}
	// Longer than the blob: cut. Shorter: it grows as chunks arrive, so
	// its size tells how far a fetch got.
	if st, err := file.Stat(); err != nil || st.Size() > man.Size {
		if err := file.Truncate(man.Size); err != nil {
			return res, fmt.Errorf("fetch: %w", err)
		}
	}
	var todo []int
	var got int64
	for i := range man.Chunks {
		if have[i] {
			res.Kept++
			got += int64(chunkLen(man.Size, i))
		} else {
			todo = append(todo, i)
		}
	}
	if res.Kept > 0 {
		f.note("continuing %s: %d of %d chunks already here", part, res.Kept, man.Chunks)
	}
	run := &chunkRun{f: f, ref: ref, size: man.Size, hashes: hashes, file: file, ranges: man.Ranges,
		fl: fl, rep: rep, res: &res, todo: todo, have: got}
	if err := run.run(ctx); err != nil {
		return res, err
	}
	if err := file.Sync(); err != nil {
		return res, fmt.Errorf("fetch: %w", err)
	}
	if _, err := file.Seek(0, io.SeekStart); err != nil {
		return res, fmt.Errorf("fetch: %w", err)
	}
	h := sha256.New()
	if _, err := io.Copy(h, file); err != nil {
		return res, fmt.Errorf("fetch: %w", err)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != ref.SHA256 {
		return res, fmt.Errorf("fetch %s: %w: the file's SHA-256 is %s", ref, ErrCorrupt, sum)
	}
	if err := file.Close(); err != nil {
		return res, fmt.Errorf("fetch: %w", err)
	}
	if err := os.Rename(part, path); err != nil {
		return res, fmt.Errorf("fetch: %w", err)
	}
	return res, nil
}

func (f *Fetcher) window() int {
	if f.Window <= 0 {
		return DefaultWindow
	}
	return f.Window
}

// manifestHashBytes is about what one chunk hash takes in a manifest (a
// page's expected size sets its deadline).
const manifestHashBytes = 70

// manifest asks the owner for the whole manifest (page by page). Any
// failure here is final: the owner is gone, or lacks the blob.
func (f *Fetcher) manifest(ctx context.Context, ref Ref, fl *flow) (Manifest, []string, error) {
	var first Manifest
	var hashes []string
	for from := 0; ; {
		data, _ := json.Marshal(ManifestRequest{SHA256: ref.SHA256, From: from})
		want := ManifestPage // hashes expected: a full page until the first says how many
		if from > 0 {
			want = min(ManifestPage, first.Chunks-from)
		}
		resp, err := f.manifestPage(ctx, ref, data, fl, 512+want*manifestHashBytes)
		if err != nil {
			return first, nil, f.failure(ref, "manifest", err)
		}
		var m Manifest
		if err := json.Unmarshal(resp, &m); err != nil {
			return first, nil, fmt.Errorf("fetch %s: %w: %v", ref, ErrBadManifest, err)
		}
		if from == 0 {
			first = m
		}
		if err := checkManifest(ref, first, m, from); err != nil {
			return first, nil, fmt.Errorf("fetch %s: %w", ref, err)
		}
		hashes = append(hashes, m.Hashes...)
		from += len(m.Hashes)
		if from >= first.Chunks {
			return first, hashes, nil
		}
	}
}

// manifestPage asks for one page of the manifest, of about size bytes. A
// deadline that passed (a slow link, or the owner still reading a large
// blob it has not indexed yet) is tried again with a longer one until
// patience; anything else is final.
func (f *Fetcher) manifestPage(ctx context.Context, ref Ref, req []byte, fl *flow, size int) ([]byte, error) {
	start := time.Now()
	pause := backoff.Policy{Min: 200 * time.Millisecond, Max: 5 * time.Second}
	for try := 0; ; try++ {
		resp, err := f.request(ctx, ref.Node, CapManifest, req, fl.deadline(size, time.Now()))
		deadline := timedOut(err) && ctx.Err() == nil
		if deadline {
			// The next deadline is longer. No ghost: the likelier cause
			// is an owner still indexing the blob, and a manifest page is
			// no more than a few chunk parts.
			fl.halve()
		}
		if err == nil || !deadline || time.Since(start) > f.patience() {
			return resp, err
		}
		f.note("manifest: %v; trying again", err)
		select {
		case <-time.After(pause.Delay(try)):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (f *Fetcher) patience() time.Duration {
	if f.Patience <= 0 {
		return DefaultPatience
	}
	return f.Patience
}

// checkManifest checks page m (from chunk from) against the blob asked
// for and the first page.
func checkManifest(ref Ref, first, m Manifest, from int) error {
	switch {
	case m.SHA256 != ref.SHA256:
		return fmt.Errorf("%w: it describes %s", ErrBadManifest, m.SHA256)
	case m.ChunkSize != ChunkSize:
		return fmt.Errorf("%w: chunk size %d, want %d", ErrBadManifest, m.ChunkSize, ChunkSize)
	case m.Size < 0 || m.Chunks != chunksOf(m.Size):
		return fmt.Errorf("%w: %d chunks for %d bytes", ErrBadManifest, m.Chunks, m.Size)
	case m.Size != first.Size || m.From != from:
		return fmt.Errorf("%w: pages disagree", ErrBadManifest)
	case len(m.Hashes) == 0 && from < m.Chunks, len(m.Hashes) > m.Chunks-from:
		return fmt.Errorf("%w: %d hashes from chunk %d of %d", ErrBadManifest, len(m.Hashes), from, m.Chunks)
	}
	for _, h := range m.Hashes {
		if err := CheckSHA256(h); err != nil {
			return fmt.Errorf("%w: %w", ErrBadManifest, err)
		}
	}
	return nil
}

// verifyPart reads what a partial file holds, chunk by chunk, and says
// which chunks verify.
func verifyPart(file *os.File, size int64, hashes []string) ([]bool, error) {
	have := make([]bool, len(hashes))
	st, err := file.Stat()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, ChunkSize)
	for i := range hashes {
		n := chunkLen(size, i)
		if int64(i)*ChunkSize+int64(n) > st.Size() {
			break
		}
		if _, err := file.ReadAt(buf[:n], int64(i)*ChunkSize); err != nil {
			return nil, err
		}
		sum := sha256.Sum256(buf[:n])
		have[i] = hex.EncodeToString(sum[:]) == hashes[i]
	}
	return have, nil
}

// failure explains a failed request of what for ref.
func (f *Fetcher) failure(ref Ref, what string, err error) error {
	var se *ServiceError
	switch {
	case errors.As(err, &se) && se.Code == CodeNotFound:
		return fmt.Errorf("fetch %s: %w on node %s", ref, ErrNotFound, ref.Node)
	case errors.As(err, &se) && se.Code == wire.CodeUnavailable:
		return fmt.Errorf("fetch %s: %s: %w: %s", ref, what, ErrUnreachable, se.Text)
	case errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("fetch %s: %s: %w: the local node does not serve blob requests", ref, what, ErrUnreachable)
	}
	return fmt.Errorf("fetch %s: %s from node %s: %w", ref, what, ref.Node, err)
}

func (f *Fetcher) note(format string, args ...any) {
	if f.Note != nil {
		f.Note(format, args...)
	}
}

// request calls capability name on node with deadline d (which travels
// with it: Meshbox-Timeout) and returns the reply's body.
func (f *Fetcher) request(ctx context.Context, node, name string, data []byte, d time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, d+localGrace)
	defer cancel()
	msg := nats.NewMsg(wire.NodeCapSubject(node, name))
	msg.Header.Set(wire.HeaderTimeout, d.Round(time.Millisecond).String())
	msg.Data = data
	resp, err := f.Conn.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return nil, err
	}
	if se := wire.ErrorOf(resp.Header); se != nil {
		return nil, se
	}
	return resp.Data, nil
}
