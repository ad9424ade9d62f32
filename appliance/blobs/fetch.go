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
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshbox/meshbox/internal/backoff"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
)

// Fetch defaults.
const (
	// DefaultWindow is how many chunks a fetch has in flight.
	DefaultWindow = 4
	// DefaultPatience is how long a fetch that has begun keeps trying
	// while nothing arrives (the broker restarting, say).
	DefaultPatience = 2 * time.Minute
	// chunkAttempts bounds the fetches of one chunk that arrives
	// corrupted.
	chunkAttempts = 5
	// requestTimeout bounds one request.
	requestTimeout = 10 * time.Second
	// PartSuffix ends the name of a fetch's partial file.
	PartSuffix = ".part"
)

// Fetcher fetches blobs from any node of the mesh through the local
// node's NATS server (conn): it asks the owner for the manifest, then for
// the chunks, Window at a time, verifies each against its hash (fetching
// a corrupted one again) and the whole file against the blob's SHA-256.
// It writes into <path>.part and renames it to path once verified; a
// fetch that finds a .part file keeps the chunks in it that verify.
type Fetcher struct {
	Conn     *nats.Conn
	Window   int           // chunks in flight (0: DefaultWindow)
	Patience time.Duration // 0: DefaultPatience
	// Progress, when set, is called as chunks arrive with the bytes the
	// file holds and the blob's size.
	Progress func(have, size int64)
	// Note, when set, is told what the fetch does besides fetching: chunks
	// kept from a partial file, a chunk fetched again, a retry.
	Note func(format string, args ...any)
	// Tamper is a test seam: called with each chunk as it arrives, before
	// it is verified.
	Tamper func(index int, data []byte)
}

// Result is what a fetch did.
type Result struct {
	Size      int64
	Chunks    int
	Kept      int // chunks found verified in a partial file
	Fetched   int // chunk requests answered
	Refetched int // chunks fetched again after failing verification
	Retries   int // requests tried again after a transient failure
}

// ServiceError is an error reply of a node (or of the bridge on the way).
type ServiceError = wire.ServiceError

// transient says whether a failed request is worth trying again within a
// fetch that has begun: the mesh or the owner was away for a moment.
func transient(err error) bool {
	var se *ServiceError
	if errors.As(err, &se) {
		return wire.Transient(se.Code)
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

// Fetch fetches the blob ref into the file path.
func (f *Fetcher) Fetch(ctx context.Context, ref Ref, path string) (Result, error) {
	var res Result
	man, hashes, err := f.manifest(ctx, ref)
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
	if err := f.fetchChunks(ctx, ref, man.Size, hashes, todo, file, got, &res); err != nil {
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

// manifest asks the owner for the whole manifest (page by page). Any
// failure here is final: the owner is gone, or lacks the blob.
func (f *Fetcher) manifest(ctx context.Context, ref Ref) (Manifest, []string, error) {
	var first Manifest
	var hashes []string
	for from := 0; ; {
		data, _ := json.Marshal(ManifestRequest{SHA256: ref.SHA256, From: from})
		resp, err := f.manifestPage(ctx, ref, data)
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

// manifestPage asks for one page of the manifest. A deadline that passed
// (the owner still reading a large blob it has not indexed yet) is tried
// again until patience; anything else is final.
func (f *Fetcher) manifestPage(ctx context.Context, ref Ref, req []byte) ([]byte, error) {
	start := time.Now()
	pause := backoff.Policy{Min: 200 * time.Millisecond, Max: 5 * time.Second}
	for try := 0; ; try++ {
		resp, err := f.request(ctx, ref.Node, CapManifest, req)
		var se *ServiceError
		deadline := errors.As(err, &se) && se.Code == wire.CodeTimeout || errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
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

// fetchChunks fetches the chunks todo with Window workers and writes them
// into file. got is what the file holds already.
func (f *Fetcher) fetchChunks(ctx context.Context, ref Ref, size int64, hashes []string, todo []int, file *os.File, got int64, res *Result) error {
	window := f.Window
	if window <= 0 {
		window = DefaultWindow
	}
	patience := f.patience()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var (
		have                        atomic.Int64
		fetched, refetched, retries atomic.Int64
		lastOK                      atomic.Int64 // unix nanoseconds of the last chunk that arrived
		wg                          sync.WaitGroup
	)
	have.Store(got)
	lastOK.Store(time.Now().UnixNano())
	if f.Progress != nil {
		f.Progress(got, size)
	}
	for range min(window, len(todo)) {
		wg.Add(1)
		go func() { // a worker: exits when next is closed or ctx is done
			defer wg.Done()
			buf := make([]byte, 0, ChunkSize)
			for i := range next {
				data, err := f.fetchChunk(ctx, ref, i, hashes[i], buf, &lastOK, patience, &fetched, &refetched, &retries)
				if err != nil {
					cancel(err)
					return
				}
				if _, err := file.WriteAt(data, int64(i)*ChunkSize); err != nil {
					cancel(fmt.Errorf("fetch: write: %w", err))
					return
				}
				n := have.Add(int64(len(data)))
				if f.Progress != nil {
					f.Progress(n, size)
				}
			}
		}()
	}
feed:
	for _, i := range todo {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	res.Fetched, res.Refetched, res.Retries = int(fetched.Load()), int(refetched.Load()), int(retries.Load())
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return nil
}

// fetchChunk fetches chunk i until it verifies: a transient failure is
// tried again with backoff until nothing arrived for patience, a chunk
// that does not verify is fetched again (chunkAttempts in all).
func (f *Fetcher) fetchChunk(ctx context.Context, ref Ref, i int, want string, buf []byte,
	lastOK *atomic.Int64, patience time.Duration, fetched, refetched, retries *atomic.Int64) ([]byte, error) {
	req, _ := json.Marshal(ChunkRequest{SHA256: ref.SHA256, Index: i})
	bad := 0
	pause := backoff.Policy{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for try := 0; ; try++ {
		data, err := f.requestInto(ctx, ref.Node, CapChunk, req, buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			if !transient(err) {
				return nil, f.failure(ref, fmt.Sprintf("chunk %d", i), err)
			}
			if time.Since(time.Unix(0, lastOK.Load())) > patience {
				return nil, fmt.Errorf("fetch %s: nothing arrived for %s: %w (what arrived is kept; fetch again to continue)", ref, patience, f.failure(ref, fmt.Sprintf("chunk %d", i), err))
			}
			retries.Add(1)
			f.note("chunk %d: %v; trying again", i, err)
			select {
			case <-time.After(pause.Delay(try)):
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
			continue
		}
		fetched.Add(1)
		if f.Tamper != nil {
			f.Tamper(i, data)
		}
		sum := sha256.Sum256(data)
		if hex.EncodeToString(sum[:]) == want {
			lastOK.Store(time.Now().UnixNano())
			return data, nil
		}
		bad++
		if bad >= chunkAttempts {
			return nil, fmt.Errorf("fetch %s: chunk %d: %w (%d times)", ref, i, ErrCorrupt, bad)
		}
		refetched.Add(1)
		f.note("chunk %d failed verification; fetching it again", i)
	}
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

// request calls capability name on node and returns the reply's body.
func (f *Fetcher) request(ctx context.Context, node, name string, data []byte) ([]byte, error) {
	return f.requestInto(ctx, node, name, data, nil)
}

// requestInto is request; with buf it copies the body into buf.
func (f *Fetcher) requestInto(ctx context.Context, node, name string, data, buf []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	msg := nats.NewMsg(wire.NodeCapSubject(node, name))
	msg.Data = data
	resp, err := f.Conn.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return nil, err
	}
	if se := wire.ErrorOf(resp.Header); se != nil {
		return nil, se
	}
	if buf != nil {
		return append(buf[:0], resp.Data...), nil
	}
	return resp.Data, nil
}
