package blobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// index is what serving a blob takes: the transfer's chunk hashes and
// where each of the object's own chunks (messages of its stream) lies.
// An index never changes once built: a blob is named by its content.
type index struct {
	sha      string
	size     int64
	modified time.Time
	hashes   []string // SHA-256 of each transfer chunk, hex
	seqs     []uint64 // stream sequence of each object chunk
	offs     []int64  // offset in the blob of each object chunk
	used     time.Time
}

// indexCacheSize bounds the indexes kept (a 1 GiB blob's is about 150 KB).
const indexCacheSize = 32

// indexes are the indexes built lately, and those being built. mu guards
// both maps.
type indexes struct {
	mu       sync.Mutex
	m        map[string]*index
	building map[string]chan struct{} // closed when the build ends
}

func newIndexes() *indexes {
	return &indexes{m: map[string]*index{}, building: map[string]chan struct{}{}}
}

// indexTimeout bounds the build of one index (reading the whole blob).
const indexTimeout = 10 * time.Minute

// get returns the index of the blob with SHA-256 sum, building it (once,
// whoever asks meanwhile waits, until ctx ends) when it is not cached.
// The build itself runs under base (the server's life) and indexTimeout,
// not ctx: a large blob's build outlives an impatient first request and
// serves the next.
func (x *indexes) get(ctx, base context.Context, s *Store, sum string) (*index, error) {
	for {
		x.mu.Lock()
		if ix := x.m[sum]; ix != nil {
			ix.used = time.Now()
			x.mu.Unlock()
			return ix, nil
		}
		wait, busy := x.building[sum]
		if !busy {
			done := make(chan struct{})
			x.building[sum] = done
			x.mu.Unlock()
			bctx, cancel := context.WithTimeout(base, indexTimeout)
			ix, err := s.buildIndex(bctx, sum)
			cancel()
			x.mu.Lock()
			delete(x.building, sum)
			close(done)
			if err == nil {
				ix.used = time.Now()
				x.put(ix)
			}
			x.mu.Unlock()
			return ix, err
		}
		x.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// forget drops the index of sum (the blob was deleted).
func (x *indexes) forget(sum string) {
	x.mu.Lock()
	delete(x.m, sum)
	x.mu.Unlock()
}

// put caches ix, dropping the least recently used beyond the bound. mu is
// held.
func (x *indexes) put(ix *index) {
	x.m[ix.sha] = ix
	for len(x.m) > indexCacheSize {
		var old *index
		for _, e := range x.m {
			if old == nil || e.used.Before(old.used) {
				old = e
			}
		}
		delete(x.m, old.sha)
	}
}

// buildIndex reads the blob with SHA-256 sum once, from its first object
// chunk to its last, hashing each transfer chunk and the whole, and
// noting where each object chunk lies. It holds one object chunk at a
// time.
func (s *Store) buildIndex(ctx context.Context, sum string) (*index, error) {
	oi, err := s.object(ctx, sum)
	if err != nil {
		return nil, err
	}
	info, _ := infoOf(oi)
	ix := &index{sha: sum, size: info.Size, modified: info.Modified}
	subj := chunkPrefix + oi.NUID
	whole, part := sha256.New(), sha256.New()
	var off int64
	partLen := 0
	seq := uint64(1)
	for range oi.Chunks {
		m, err := s.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if err != nil {
			return nil, fmt.Errorf("index blob %s: chunk at %d: %w", sum, off, err)
		}
		ix.seqs = append(ix.seqs, m.Sequence)
		ix.offs = append(ix.offs, off)
		data := m.Data
		whole.Write(data)
		off += int64(len(data))
		for len(data) > 0 {
			n := min(len(data), ChunkSize-partLen)
			part.Write(data[:n])
			partLen += n
			data = data[n:]
			if partLen == ChunkSize {
				ix.hashes = append(ix.hashes, hex.EncodeToString(part.Sum(nil)))
				part.Reset()
				partLen = 0
			}
		}
		seq = m.Sequence + 1
	}
	if partLen > 0 {
		ix.hashes = append(ix.hashes, hex.EncodeToString(part.Sum(nil)))
	}
	if off != info.Size || hex.EncodeToString(whole.Sum(nil)) != sum || len(ix.hashes) != chunksOf(info.Size) {
		return nil, fmt.Errorf("index blob %s: the stored object does not match its digest", sum)
	}
	return ix, nil
}

// readChunk reads transfer chunk i of the blob ix into buf (which has
// room for ChunkSize bytes) and returns it.
func (s *Store) readChunk(ctx context.Context, ix *index, i int, buf []byte) ([]byte, error) {
	if i < 0 || i >= len(ix.hashes) {
		return nil, fmt.Errorf("chunk %d out of range 0..%d", i, len(ix.hashes)-1)
	}
	start := int64(i) * ChunkSize
	end := start + int64(chunkLen(ix.size, i))
	buf = buf[:0]
	// The object chunk holding start: the last whose offset is <= start.
	k := sort.Search(len(ix.offs), func(k int) bool { return ix.offs[k] > start }) - 1
	for ; k < len(ix.seqs) && ix.offs[k] < end; k++ {
		m, err := s.stream.GetMsg(ctx, ix.seqs[k])
		if err != nil {
			return nil, fmt.Errorf("read blob %s chunk %d: %w", ix.sha, i, err)
		}
		lo := max(start, ix.offs[k]) - ix.offs[k]
		hi := min(end, ix.offs[k]+int64(len(m.Data))) - ix.offs[k]
		if lo > hi || hi > int64(len(m.Data)) {
			return nil, fmt.Errorf("read blob %s chunk %d: the stored object changed", ix.sha, i)
		}
		buf = append(buf, m.Data[lo:hi]...)
	}
	if int64(len(buf)) != end-start {
		return nil, fmt.Errorf("read blob %s chunk %d: got %d bytes, want %d", ix.sha, i, len(buf), end-start)
	}
	return buf, nil
}
