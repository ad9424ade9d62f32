package blobs

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Bucket is the JetStream object store that holds the node's blobs, in
// the node's own NATS server. Its stream is StreamName; object metadata
// goes on MetaSubjects, chunks on $O.<Bucket>.C.<nuid>.
const (
	Bucket       = "meshbox-blobs"
	StreamName   = "OBJ_" + Bucket
	MetaSubjects = "$O." + Bucket + ".M.>"
	chunkPrefix  = "$O." + Bucket + ".C."
	digestPrefix = "SHA-256="
)

// Limits are the store's retention: a blob is kept until it is deleted,
// older than MaxAge (0: no limit), or among the oldest when the blobs
// together exceed MaxBytes.
// DefaultMaxBytes is the store's size limit unless configured: 1 GiB.
const DefaultMaxBytes = 1 << 30

type Limits struct {
	MaxBytes int64
	MaxAge   time.Duration
}

// Info is what the store knows of one blob.
type Info struct {
	SHA256   string    `json:"sha256"`
	Name     string    `json:"name"` // the object's name: its SHA-256 when meshbox put it
	Size     int64     `json:"size"`
	Modified time.Time `json:"modified"`
}

// Store is the node's blob store: the object store Bucket. Its methods are
// safe for concurrent use; it holds no goroutines of its own.
type Store struct {
	js     jetstream.JetStream
	obs    jetstream.ObjectStore
	stream jetstream.Stream
}

// putWindow is how many chunks a put has in flight (published, not yet
// acknowledged): 32 MiB. nats.go's default of 4,000 is a gigabyte of
// chunks, past what the server buffers for a stream (128 MiB): on a busy
// machine whose disk fell behind, a put was refused "too many requests"
// (429). The window keeps a put within the buffer at any disk speed.
const putWindow = (32 << 20) / ChunkSize

// newJetStream is the JetStream context of the blob store on nc.
func newJetStream(nc *nats.Conn) (jetstream.JetStream, error) {
	return jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(putWindow))
}

// Open creates the blob store on nc's server, or updates its limits, and
// returns it. The node calls it at start with its configured limits.
func Open(ctx context.Context, nc *nats.Conn, lim Limits) (*Store, error) {
	js, err := newJetStream(nc)
	if err != nil {
		return nil, fmt.Errorf("blob store: %w", err)
	}
	obs, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      Bucket,
		Description: "meshbox blobs",
		TTL:         lim.MaxAge,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("blob store: %w", err)
	}
	return bind(ctx, js, obs)
}

// Bind returns the blob store that exists on nc's server (the CLI's way
// in).
func Bind(ctx context.Context, nc *nats.Conn) (*Store, error) {
	js, err := newJetStream(nc)
	if err != nil {
		return nil, fmt.Errorf("blob store: %w", err)
	}
	obs, err := js.ObjectStore(ctx, Bucket)
	if err != nil {
		if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
			errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
			return nil, ErrNoStore
		}
		return nil, fmt.Errorf("blob store: %w", err)
	}
	return bind(ctx, js, obs)
}

func bind(ctx context.Context, js jetstream.JetStream, obs jetstream.ObjectStore) (*Store, error) {
	stream, err := js.Stream(ctx, StreamName)
	if err != nil {
		return nil, fmt.Errorf("blob store: %w", err)
	}
	return &Store{js: js, obs: obs, stream: stream}, nil
}

// PutFile stores the file at path under its SHA-256 and returns its info.
// A blob already stored is not stored again. maxBytes > 0 refuses a file
// larger than that.
func (s *Store) PutFile(ctx context.Context, path string, maxBytes int64) (Info, error) {
	f, err := os.Open(path)
	if err != nil {
		return Info{}, fmt.Errorf("put: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Info{}, fmt.Errorf("put: %w", err)
	}
	if !st.Mode().IsRegular() {
		return Info{}, fmt.Errorf("put: %s is not a regular file", path)
	}
	if maxBytes > 0 && st.Size() > maxBytes {
		return Info{}, fmt.Errorf("put %s: %w (%d bytes, the store holds at most %d)", path, ErrTooLarge, st.Size(), maxBytes)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return Info{}, fmt.Errorf("put: read %s: %w", path, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if info, err := s.Stat(ctx, sum); err == nil {
		return info, nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Info{}, fmt.Errorf("put: %w", err)
	}
	oi, err := s.obs.Put(ctx, jetstream.ObjectMeta{
		Name: sum,
		Opts: &jetstream.ObjectMetaOptions{ChunkSize: ChunkSize},
	}, f)
	if err != nil {
		return Info{}, fmt.Errorf("put %s: %w", path, err)
	}
	info, ok := infoOf(oi)
	if !ok || info.SHA256 != sum || info.Size != st.Size() {
		// The file changed while it was read.
		_ = s.obs.Delete(ctx, sum)
		return Info{}, fmt.Errorf("put %s: the file changed while it was stored", path)
	}
	return s.Stat(ctx, sum)
}

// Stat returns the info of the blob with SHA-256 sum: the object named
// sum, or else any object whose digest is sum (a program may have put it
// under another name).
func (s *Store) Stat(ctx context.Context, sum string) (Info, error) {
	oi, err := s.object(ctx, sum)
	if err != nil {
		return Info{}, err
	}
	info, _ := infoOf(oi)
	return info, nil
}

// object finds the object of the blob with SHA-256 sum.
func (s *Store) object(ctx context.Context, sum string) (*jetstream.ObjectInfo, error) {
	oi, err := s.obs.GetInfo(ctx, sum)
	if err == nil {
		if info, ok := infoOf(oi); ok && info.SHA256 == sum {
			return oi, nil
		}
	} else if !errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("blob %s: %w", sum, err)
	}
	all, err := s.objects(ctx)
	if err != nil {
		return nil, err
	}
	for _, oi := range all {
		if info, ok := infoOf(oi); ok && info.SHA256 == sum {
			return oi, nil
		}
	}
	return nil, fmt.Errorf("%w: %s", ErrNotFound, sum)
}

// listLimit bounds one listing of the store's objects, listTries the
// listings tried. A listing reads the object store's metadata stream
// through an ordered consumer; one that races a delete (the retention
// keeper's) has been seen to wait for ever, which a caller without a
// deadline of its own would wait with.
const (
	listLimit = 5 * time.Second
	listTries = 3
)

// objects lists the store's objects (none is not an error).
func (s *Store) objects(ctx context.Context) ([]*jetstream.ObjectInfo, error) {
	var err error
	for try := 1; try <= listTries; try++ {
		lctx, cancel := context.WithTimeout(ctx, listLimit)
		var all []*jetstream.ObjectInfo
		all, err = s.obs.List(lctx)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrNoObjectsFound):
			return nil, nil
		case err == nil:
			return all, nil
		case ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded):
			return nil, fmt.Errorf("list blobs: %w", err)
		}
	}
	return nil, fmt.Errorf("list blobs: no answer within %s, %d times: %w", listLimit, listTries, err)
}

// List returns the blobs, oldest first.
func (s *Store) List(ctx context.Context) ([]Info, error) {
	all, err := s.objects(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(all))
	for _, oi := range all {
		if info, ok := infoOf(oi); ok {
			out = append(out, info)
		}
	}
	slices.SortFunc(out, func(a, b Info) int { return a.Modified.Compare(b.Modified) })
	return out, nil
}

// Remove deletes the blob with SHA-256 sum.
func (s *Store) Remove(ctx context.Context, sum string) error {
	oi, err := s.object(ctx, sum)
	if err != nil {
		return err
	}
	if err := s.obs.Delete(ctx, oi.Name); err != nil {
		return fmt.Errorf("remove blob %s: %w", sum, err)
	}
	return nil
}

// Prune deletes the oldest blobs until the rest hold at most maxBytes
// together, and returns what it deleted. (Age is the stream's own limit.)
func (s *Store) Prune(ctx context.Context, maxBytes int64) ([]Info, error) {
	list, err := s.List(ctx)
	if err != nil {
		return nil, err
	}
	var total int64
	for _, b := range list {
		total += b.Size
	}
	var gone []Info
	for _, b := range list {
		if total <= maxBytes {
			break
		}
		if err := s.obs.Delete(ctx, b.Name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return gone, fmt.Errorf("prune blob %s: %w", b.SHA256, err)
		}
		total -= b.Size
		gone = append(gone, b)
	}
	return gone, nil
}

// Usage is the number of blobs and their total size.
func (s *Store) Usage(ctx context.Context) (count int, bytes int64, err error) {
	list, err := s.List(ctx)
	for _, b := range list {
		bytes += b.Size
	}
	return len(list), bytes, err
}

// infoOf turns an object's info into a blob's; ok is false for deleted
// objects, links, and digests that are not SHA-256.
func infoOf(oi *jetstream.ObjectInfo) (Info, bool) {
	if oi == nil || oi.Deleted || (oi.Opts != nil && oi.Opts.Link != nil) {
		return Info{}, false
	}
	sum, ok := digestHex(oi.Digest)
	if !ok {
		return Info{}, false
	}
	return Info{SHA256: sum, Name: oi.Name, Size: int64(oi.Size), Modified: oi.ModTime.UTC()}, true
}

// digestHex turns an object store digest ("SHA-256=" and URL-safe
// base64) into lowercase hex.
func digestHex(d string) (string, bool) {
	b64, ok := strings.CutPrefix(d, digestPrefix)
	if !ok {
		return "", false
	}
	raw, err := base64.URLEncoding.DecodeString(b64)
	if err != nil || len(raw) != sha256.Size {
		return "", false
	}
	return hex.EncodeToString(raw), true
}
