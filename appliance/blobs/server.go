package blobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Local subjects of the capabilities (what the node subscribes on its own
// server; the bridge hands it node.<node>.cap.<name> requests there).
const (
	subjManifest = wire.CapPrefix + CapManifest
	subjChunk    = wire.CapPrefix + CapChunk
)

// chunkWorkers bounds the chunk requests the server reads at once; each
// holds one chunk buffer.
const chunkWorkers = 4

// opTimeout bounds one operation of the server on its store.
const opTimeout = 30 * time.Second

// ServerConfig is what a Server needs.
type ServerConfig struct {
	Conn *nats.Conn // the node's own connection to its server
	// Replies, when set, is the connection the server answers on (the
	// node's responder, which may publish on inboxes only); nil: Conn.
	Replies *nats.Conn
	// ReplyAllowed, when set, says whether a request on subject may be
	// answered at reply (a party allowed to send it may receive there);
	// a request refused is dropped and logged once per subject.
	ReplyAllowed func(subject, reply string) error
	// Store is the blob store if it exists (nil: it is made on the first
	// SubjectOpen request, with Limits).
	Store  *Store
	Limits Limits
	Logger *slog.Logger
}

// Server answers the blob capabilities from the node's store and keeps
// the store within its limits. Build it with NewServer, stop it with
// Close.
type Server struct {
	cfg     ServerConfig
	refused sync.Map // subjects of requests refused for their reply subject, logged once
	counts  servedCounts
	fetches *fetchBook
	ix      *indexes
	subs    []*nats.Subscription
	sem     chan struct{}   // a token per chunk read in progress
	bufs    sync.Pool       // *[]byte of ChunkSize
	wake    chan struct{}   // cap 1: the keeper looks at the store again
	quit    chan struct{}   // closed by Close
	ctx     context.Context // cancelled by Close
	cancel  context.CancelFunc
	wg      sync.WaitGroup // the keeper and chunk readers
	once    sync.Once

	// usage is what the keeper last saw: blobs, bytes, and the blobs
	// retention deleted since start.
	store  atomic.Pointer[Store] // nil until the store exists
	openMu sync.Mutex            // serializes making the store

	usageMu   sync.Mutex
	usage     Usage
	announced []string // names of blobs put since the keeper last looked
}

// Usage is what the store holds, as the keeper last saw it.
type Usage struct {
	Count  int    `json:"count"`
	Bytes  int64  `json:"bytes"`
	Pruned int    `json:"pruned"` // blobs deleted by the size limit since start
	Error  string `json:"error,omitempty"`
}

// Usage is what the store holds, as of its last change.
func (s *Server) Usage() Usage {
	s.usageMu.Lock()
	defer s.usageMu.Unlock()
	return s.usage
}

// NewServer subscribes the blob capabilities and the store's metadata
// subject (a put or delete by anyone wakes the keeper: retention and the
// index of a new blob) and starts the keeper, which prunes once at once.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg: cfg, ix: newIndexes(), fetches: newFetchBook(cfg.Logger),
		sem:  make(chan struct{}, chunkWorkers),
		wake: make(chan struct{}, 1),
		quit: make(chan struct{}),
		ctx:  ctx, cancel: cancel,
	}
	s.bufs.New = func() any { b := make([]byte, 0, ChunkSize); return &b }
	s.store.Store(cfg.Store)
	for subj, h := range map[string]nats.MsgHandler{
		subjManifest:   s.onManifest,
		subjChunk:      s.onChunk,
		MetaSubjects:   s.onMeta,
		SubjectOpen:    s.onOpen,
		SubjectFetches: s.onFetchReport,
	} {
		h := h
		sub, err := cfg.Conn.Subscribe(subj, func(m *nats.Msg) {
			if s.replyOK(m) {
				h(m)
			}
		})
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("blob server: subscribe %s: %w", subj, err)
		}
		s.subs = append(s.subs, sub)
	}
	s.wake <- struct{}{}
	s.wg.Add(1)
	go s.keep() // exits when Close closes quit
	return s, nil
}

// Close stops answering and waits for the keeper and the chunk reads in
// progress. Idempotent.
func (s *Server) Close() {
	s.once.Do(func() {
		for _, sub := range s.subs {
			_ = sub.Unsubscribe()
		}
		close(s.quit)
		s.cancel()
		s.wg.Wait()
	})
}

// Open makes the blob store with the server's limits if it does not exist
// yet and returns it. Until the first blob is put, a node has no stream:
// any JetStream stream keeps the NATS server's access-time ticker running
// (10 times a second), which an idle node would otherwise pay for.
func (s *Server) Open(ctx context.Context) (*Store, error) {
	if st := s.store.Load(); st != nil {
		return st, nil
	}
	s.openMu.Lock()
	defer s.openMu.Unlock()
	if st := s.store.Load(); st != nil {
		return st, nil
	}
	st, err := Open(ctx, s.cfg.Conn, s.cfg.Limits)
	if err != nil {
		return nil, err
	}
	s.store.Store(st)
	s.cfg.Logger.Info("blob store made", "bucket", Bucket)
	return st, nil
}

// onOpen answers SubjectOpen: the store exists (made now if need be).
func (s *Server) onOpen(m *nats.Msg) {
	ctx, cancel := context.WithTimeout(s.ctx, opTimeout)
	defer cancel()
	if _, err := s.Open(ctx); err != nil {
		s.respondError(m, KindOpen, CodeInternal, err.Error())
		return
	}
	s.counts.add(KindOpen, OutcomeOK, 0)
	s.respond(m, []byte(`{"bucket":"`+Bucket+`"}`))
}

// onMeta hears an object's metadata as it is put or deleted: it forgets
// the index of a deleted blob and wakes the keeper.
func (s *Server) onMeta(m *nats.Msg) {
	var oi jetstream.ObjectInfo
	if json.Unmarshal(m.Data, &oi) == nil {
		if oi.Deleted {
			if sum, ok := digestHex(oi.Digest); ok {
				s.ix.forget(sum)
			}
		} else if oi.Name != "" {
			s.announce(oi.Name)
		}
	}
	s.poke()
}

// poke wakes the keeper (coalesced).
func (s *Server) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// keep applies the size limit whenever the store changed and builds the
// indexes of new blobs, so that the first fetch does not wait for them.
// It sleeps otherwise (the age limit is the stream's own). Exits when
// quit is closed.
func (s *Server) keep() {
	defer s.wg.Done()
	for {
		select {
		case <-s.quit:
			return
		case <-s.wake:
		}
		// A metadata message reaches the keeper as the stream stores it,
		// maybe before: look until every blob announced is listed (or
		// deleted), a little longer each time.
		for try := 0; ; try++ {
			announced := s.takeAnnounced()
			if s.keepOnce(announced) || try >= 20 {
				break
			}
			s.announce(announced...)
			select {
			case <-s.quit:
				return
			case <-time.After(time.Duration(try+1) * 50 * time.Millisecond):
			}
		}
	}
}

// keepOnce applies the size limit, records the usage and builds the
// indexes of the newest blobs. It reports false when a blob announced is
// not listed yet.
func (s *Server) keepOnce(announced []string) bool {
	store := s.store.Load()
	if store == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(s.ctx, opTimeout)
	defer cancel()
	pruned := 0
	if s.cfg.Limits.MaxBytes > 0 {
		gone, err := store.Prune(ctx, s.cfg.Limits.MaxBytes)
		for _, b := range gone {
			s.ix.forget(b.SHA256)
			s.cfg.Logger.Info("blob deleted: the store is over its size limit", "sha256", b.SHA256, "size", b.Size)
		}
		if err != nil {
			s.cfg.Logger.Warn("blob retention", "err", err)
		}
		pruned = len(gone)
	}
	list, err := store.List(ctx)
	s.setUsage(list, pruned, err)
	if err != nil {
		s.cfg.Logger.Warn("blob store", "err", err)
		return true
	}
	// The newest first: the one just put is the likeliest to be asked for.
	for i := len(list) - 1; i >= 0 && i >= len(list)-4; i-- {
		if _, err := s.ix.get(ctx, s.ctx, store, list[i].SHA256); err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("blob index", "sha256", list[i].SHA256, "err", err)
		}
	}
	listed := map[string]bool{}
	for _, b := range list {
		listed[b.Name] = true
	}
	for _, name := range announced {
		if !listed[name] && pruned == 0 {
			return false
		}
	}
	return true
}

// announce notes blobs put (by name) that the keeper should see listed.
func (s *Server) announce(names ...string) {
	s.usageMu.Lock()
	defer s.usageMu.Unlock()
	s.announced = append(s.announced, names...)
}

// takeAnnounced returns the blobs announced and forgets them.
func (s *Server) takeAnnounced() []string {
	s.usageMu.Lock()
	defer s.usageMu.Unlock()
	a := s.announced
	s.announced = nil
	return a
}

// setUsage records what the keeper saw.
func (s *Server) setUsage(list []Info, pruned int, err error) {
	s.usageMu.Lock()
	defer s.usageMu.Unlock()
	s.usage.Count, s.usage.Bytes, s.usage.Error = len(list), 0, ""
	for _, b := range list {
		s.usage.Bytes += b.Size
	}
	s.usage.Pruned += pruned
	if err != nil {
		s.usage.Error = err.Error()
	}
}

// onManifest answers a ManifestRequest.
func (s *Server) onManifest(m *nats.Msg) {
	const kind = KindManifest
	var req ManifestRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		s.respondError(m, kind, CodeBadInput, "bad manifest request: "+err.Error())
		return
	}
	if err := CheckSHA256(req.SHA256); err != nil {
		s.respondError(m, kind, CodeBadInput, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, opTimeout)
	defer cancel()
	store := s.store.Load()
	if store == nil {
		s.respondError(m, kind, CodeNotFound, fmt.Sprintf("%v: %s (the node has no blobs)", ErrNotFound, req.SHA256))
		return
	}
	// The blob may have gone since its index was built.
	if _, err := store.Stat(ctx, req.SHA256); err != nil {
		s.ix.forget(req.SHA256)
		s.respondStoreError(m, kind, err)
		return
	}
	ix, err := s.ix.get(ctx, s.ctx, store, req.SHA256)
	if err != nil {
		s.respondStoreError(m, kind, err)
		return
	}
	if req.From < 0 || req.From > len(ix.hashes) {
		s.respondError(m, kind, CodeBadInput, fmt.Sprintf("from %d out of range 0..%d", req.From, len(ix.hashes)))
		return
	}
	to := min(len(ix.hashes), req.From+ManifestPage)
	data, _ := json.Marshal(Manifest{ // strings and numbers: cannot fail
		SHA256: ix.sha, Size: ix.size, ChunkSize: ChunkSize, Chunks: len(ix.hashes),
		From: req.From, Hashes: ix.hashes[req.From:to], Modified: ix.modified, Ranges: true,
	})
	s.counts.add(kind, OutcomeOK, 0)
	s.respond(m, data)
}

// onChunk answers a ChunkRequest on a reader of its own, at most
// chunkWorkers at once (the subscription's goroutine waits for a token).
// A request whose deadline (Meshbox-Timeout, the time its caller had
// left when it arrived) passed before a reader was free is dropped: its
// caller has given up, and the answer would only fill the link.
func (s *Server) onChunk(m *nats.Msg) {
	const kind = KindChunk
	at := time.Now()
	var req ChunkRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		s.respondError(m, kind, CodeBadInput, "bad chunk request: "+err.Error())
		return
	}
	if err := CheckSHA256(req.SHA256); err != nil {
		s.respondError(m, kind, CodeBadInput, err.Error())
		return
	}
	if req.Offset < 0 || req.Offset >= ChunkSize || req.Length < 0 || req.Length > ChunkSize {
		s.respondError(m, kind, CodeBadInput, fmt.Sprintf("offset %d and length %d: want 0 <= offset < %d, 0 <= length <= %d", req.Offset, req.Length, ChunkSize, ChunkSize))
		return
	}
	deadline, err := requestDeadline(m.Header, at)
	if err != nil {
		s.respondError(m, kind, CodeBadInput, err.Error())
		return
	}
	select {
	case s.sem <- struct{}{}:
	case <-s.quit:
		return
	}
	s.wg.Add(1)
	go func() { // exits once the chunk is answered
		defer s.wg.Done()
		defer func() { <-s.sem }()
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			s.counts.add(kind, OutcomeExpired, 0)
			return
		}
		ctx, cancel := context.WithTimeout(s.ctx, opTimeout)
		defer cancel()
		store := s.store.Load()
		if store == nil {
			s.respondError(m, kind, CodeNotFound, fmt.Sprintf("%v: %s (the node has no blobs)", ErrNotFound, req.SHA256))
			return
		}
		ix, err := s.ix.get(ctx, s.ctx, store, req.SHA256)
		if err != nil {
			s.respondStoreError(m, kind, err)
			return
		}
		bp := s.bufs.Get().(*[]byte)
		defer s.bufs.Put(bp)
		data, err := store.readChunk(ctx, ix, req.Index, *bp)
		if err != nil {
			code := CodeInternal
			switch {
			case req.Index < 0 || req.Index >= len(ix.hashes):
				code = CodeBadInput
			case errors.Is(err, jetstream.ErrMsgNotFound):
				s.ix.forget(req.SHA256)
				code, err = CodeNotFound, fmt.Errorf("%w: %s", ErrNotFound, req.SHA256)
			}
			s.respondError(m, kind, code, err.Error())
			return
		}
		end := len(data)
		if req.Length > 0 {
			end = req.Offset + req.Length
		}
		if req.Offset >= len(data) || end > len(data) {
			s.respondError(m, kind, CodeBadInput, fmt.Sprintf("offset %d and length %d: beyond chunk %d of %d bytes", req.Offset, req.Length, req.Index, len(data)))
			return
		}
		data = data[req.Offset:end]
		s.counts.add(kind, OutcomeOK, len(data))
		s.respond(m, data)
	}()
}

func (s *Server) respondStoreError(m *nats.Msg, kind string, err error) {
	if errors.Is(err, ErrNotFound) {
		s.respondError(m, kind, CodeNotFound, err.Error())
		return
	}
	s.respondError(m, kind, CodeInternal, err.Error())
}

// respondError answers a request of kind with a NATS micro error, and
// counts it.
func (s *Server) respondError(m *nats.Msg, kind string, code int, text string) {
	s.counts.add(kind, outcomeOf(code), 0)
	r := nats.NewMsg(m.Reply)
	wire.SetError(r.Header, code, text)
	s.send(r)
}

// respond answers m with data.
func (s *Server) respond(m *nats.Msg, data []byte) {
	s.send(&nats.Msg{Subject: m.Reply, Data: data})
}

// send publishes an answer on the replies connection.
func (s *Server) send(r *nats.Msg) {
	if r.Subject == "" {
		return
	}
	conn := s.cfg.Conn
	if s.cfg.Replies != nil {
		conn = s.cfg.Replies
	}
	_ = conn.PublishMsg(r) // the caller may have gone
}

// replyOK checks m's reply subject before the server acts on m.
func (s *Server) replyOK(m *nats.Msg) bool {
	if m.Reply == "" || s.cfg.ReplyAllowed == nil {
		return true
	}
	err := s.cfg.ReplyAllowed(m.Subject, m.Reply)
	if err == nil {
		return true
	}
	if _, seen := s.refused.LoadOrStore(m.Subject, true); !seen {
		s.cfg.Logger.Warn("blob request refused (logged once per subject)", "subject", m.Subject, "err", err)
	}
	return false
}
