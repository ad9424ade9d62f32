package blobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/meshbox/meshbox/internal/backoff"
)

// span is a part of a chunk: n bytes from offset off.
type span struct{ chunk, off, n int }

// chunkProgress is a chunk begun and not verified yet.
type chunkProgress struct {
	next int // offset of the first byte not asked for yet
	got  int // bytes arrived
	bad  int // times it failed verification or a part came back the wrong size
}

// answer is what one request brought back to the run's loop.
type answer struct {
	s          span
	sent, at   time.Time
	data       []byte
	err        error
	whole      bool // the whole chunk in one reply: verified by the requester
	verified   bool // whole, and it matches its hash
	written    bool
	writeError error
}

// chunkRun is the chunk phase of one fetch: one loop (run) asks for spans
// as the flow makes room, each request on a goroutine of its own that
// writes what arrives at its offset in the file and hands the answer back
// on answers. Only the loop touches the run's fields; a chunk is verified
// once all its bytes arrived.
type chunkRun struct {
	f      *Fetcher
	ref    Ref
	size   int64
	hashes []string
	file   *os.File
	ranges bool // the owner serves parts of chunks
	fl     *flow
	rep    *reporter
	res    *Result

	todo     []int // chunks not begun, in order
	cur      int   // the chunk being split into requests (-1: none)
	chunks   map[int]*chunkProgress
	again    []span // to ask for again, first
	inflight int    // requests in flight
	have     int64  // bytes the file holds
	lastOK   time.Time
	// After the owner or the mesh was away (503), nothing is asked before
	// pause; such failures in a row (away) make it longer.
	pause   time.Time
	away    int
	answers chan answer
	buf     []byte // for verifying a chunk read back from the file
}

// retryPause is the fetch's backoff after the owner or the mesh was away
// (a deadline that passed is tried again at once: it waited already).
var retryPause = backoff.Policy{Min: 100 * time.Millisecond, Max: 5 * time.Second}

// run fetches the chunks todo. It returns once every chunk verified, or at
// the first failure that is final, after its requests ended.
func (r *chunkRun) run(ctx context.Context) (err error) {
	r.cur, r.chunks, r.lastOK = -1, map[int]*chunkProgress{}, time.Now()
	r.answers = make(chan answer)
	reqCtx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		for ; r.inflight > 0; r.inflight-- {
			<-r.answers
		}
	}()
	r.progress()
	tick := time.NewTicker(ReportInterval)
	defer tick.Stop()
	wake := time.NewTimer(time.Hour)
	defer wake.Stop()
	for {
		now := time.Now()
		r.launch(reqCtx, now)
		if r.inflight == 0 && len(r.again) == 0 && len(r.todo) == 0 && r.cur < 0 && len(r.chunks) == 0 {
			return nil
		}
		wake.Reset(r.nextWake(now))
		select {
		case a := <-r.answers:
			r.inflight--
			if err := r.take(a); err != nil {
				return err
			}
		case <-wake.C:
		case <-tick.C:
			r.report()
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// launch sends requests while the flow has room, unless the fetch
// pauses.
func (r *chunkRun) launch(ctx context.Context, now time.Time) {
	if now.Before(r.pause) {
		return
	}
	for {
		p := ChunkSize // an owner that does not serve parts: whole chunks
		if r.ranges {
			p = r.fl.piece()
		}
		if !r.fl.room(p, now) {
			return
		}
		s, ok := r.nextSpan(p)
		if !ok {
			return
		}
		d := r.fl.deadline(s.n, now)
		r.fl.sent(s.n, now)
		r.inflight++
		go r.ask(ctx, s, d, now) // ends when the request is answered, at its deadline at the latest
	}
}

// nextSpan takes the next span to ask for, at most p bytes: a span to ask
// again, the rest of the chunk being split, or the next chunk.
func (r *chunkRun) nextSpan(p int) (span, bool) {
	if len(r.again) > 0 {
		a := r.again[0]
		if a.n <= p {
			r.again = r.again[1:]
			return a, true
		}
		r.again[0].off, r.again[0].n = a.off+p, a.n-p
		return span{a.chunk, a.off, p}, true
	}
	if r.cur < 0 {
		if len(r.todo) == 0 {
			return span{}, false
		}
		r.cur, r.todo = r.todo[0], r.todo[1:]
		r.chunks[r.cur] = &chunkProgress{}
	}
	c, cp := r.cur, r.chunks[r.cur]
	s := span{c, cp.next, min(p, chunkLen(r.size, c)-cp.next)}
	cp.next += s.n
	if cp.next == chunkLen(r.size, c) {
		r.cur = -1
	}
	return s, true
}

// nextWake is when the loop looks again without an answer: the pause
// over, or a ghost gone.
func (r *chunkRun) nextWake(now time.Time) time.Duration {
	at := r.fl.nextChange(now)
	if r.pause.After(now) && (at.IsZero() || r.pause.Before(at)) {
		at = r.pause
	}
	if at.IsZero() {
		return time.Hour
	}
	return max(at.Sub(now), time.Millisecond)
}

// ask requests span s with deadline d and hands the answer to the loop,
// after writing what arrived into the file.
func (r *chunkRun) ask(ctx context.Context, s span, d time.Duration, sent time.Time) {
	req := ChunkRequest{SHA256: r.ref.SHA256, Index: s.chunk}
	clen := chunkLen(r.size, s.chunk)
	if s.off != 0 || s.n != clen {
		req.Offset, req.Length = s.off, s.n
	}
	body, _ := json.Marshal(req)
	data, err := r.f.request(ctx, r.ref.Node, CapChunk, body, d)
	a := answer{s: s, sent: sent, at: time.Now(), data: data, err: err}
	if err == nil {
		if r.f.Tamper != nil {
			r.f.Tamper(s.chunk, data)
		}
		a.whole = s.off == 0 && s.n == clen && len(data) == clen
		if a.whole {
			sum := sha256.Sum256(data)
			a.verified = hex.EncodeToString(sum[:]) == r.hashes[s.chunk]
		}
		if len(data) == s.n && (!a.whole || a.verified) {
			_, a.writeError = r.file.WriteAt(data, int64(s.chunk)*ChunkSize+int64(s.off))
			a.written = a.writeError == nil
		}
	}
	r.answers <- a
}

// take handles an answer: a failure is tried again or ends the fetch;
// what arrived counts, and a chunk whose bytes all arrived is verified.
func (r *chunkRun) take(a answer) error {
	s := a.s
	if a.err != nil {
		return r.failed(a)
	}
	r.fl.arrived(s.n, len(a.data), a.at.Sub(a.sent), a.at)
	r.res.Requests++
	r.res.Bytes += int64(len(a.data))
	if a.writeError != nil {
		return fmt.Errorf("fetch: write: %w", a.writeError)
	}
	cp := r.chunks[s.chunk]
	if len(a.data) != s.n {
		cp.bad++
		if cp.bad >= chunkAttempts {
			return fmt.Errorf("fetch %s: chunk %d: %w (%d bytes arrived where %d were asked for)", r.ref, s.chunk, ErrCorrupt, len(a.data), s.n)
		}
		r.res.Refetched++
		r.f.note("chunk %d: %d bytes arrived where %d were asked for; asking again", s.chunk, len(a.data), s.n)
		r.again = append(r.again, s)
		return nil
	}
	r.lastOK, r.away = a.at, 0
	cp.got += s.n
	if a.written {
		r.have += int64(s.n)
	}
	clen := chunkLen(r.size, s.chunk)
	if cp.got < clen {
		r.progress()
		return nil
	}
	r.res.Fetched++
	ok := a.verified
	if !a.whole {
		var err error
		if ok, err = r.verify(s.chunk); err != nil {
			return fmt.Errorf("fetch: read back chunk %d: %w", s.chunk, err)
		}
		if !ok {
			r.have -= int64(clen)
		}
	}
	if ok {
		delete(r.chunks, s.chunk)
		r.progress()
		return nil
	}
	cp.bad++
	if cp.bad >= chunkAttempts {
		return fmt.Errorf("fetch %s: chunk %d: %w (%d times)", r.ref, s.chunk, ErrCorrupt, cp.bad)
	}
	r.res.Refetched++
	r.f.note("chunk %d failed verification; fetching it again", s.chunk)
	cp.got = 0
	r.again = append(r.again, span{s.chunk, 0, clen})
	r.progress()
	return nil
}

// failed handles a request that failed: a transient failure is tried
// again (a deadline that passed at once, with a slower flow; after an
// owner or mesh away, the whole fetch pauses first) until a request sent
// when nothing had arrived for patience fails too; anything else is
// final. A request sent before then is tried once more: the process may
// have been stopped (or the machine asleep) while it was out, and its
// failure says nothing of the mesh now.
func (r *chunkRun) failed(a answer) error {
	s, err := a.s, a.err
	what := fmt.Sprintf("chunk %d", s.chunk)
	if !transient(err) {
		r.fl.failed(s.n, a.at)
		return r.f.failure(r.ref, what, err)
	}
	if timedOut(err) {
		r.fl.timedOut(s.n, a.at)
		r.res.TimedOut++
	} else {
		r.fl.failed(s.n, a.at)
		if !a.at.Before(r.pause) { // the first of the requests that failed together
			r.away++
			r.pause = a.at.Add(retryPause.Delay(r.away))
		}
	}
	if patience := r.f.patience(); a.sent.Sub(r.lastOK) > patience {
		return fmt.Errorf("fetch %s: %w for %s: %w (what arrived is kept; fetch again to continue)", r.ref, ErrStalled, patience, r.f.failure(r.ref, what, err))
	}
	r.res.Retries++
	r.f.note("%s: %v; trying again", what, err)
	r.again = append(r.again, s)
	return nil
}

// verify reads chunk c back from the file and checks it against its hash.
func (r *chunkRun) verify(c int) (bool, error) {
	n := chunkLen(r.size, c)
	if r.buf == nil {
		r.buf = make([]byte, ChunkSize)
	}
	if _, err := r.file.ReadAt(r.buf[:n], int64(c)*ChunkSize); err != nil {
		return false, err
	}
	sum := sha256.Sum256(r.buf[:n])
	return hex.EncodeToString(sum[:]) == r.hashes[c], nil
}

// progress tells the Fetcher's Progress and the reporter what the file
// holds.
func (r *chunkRun) progress() {
	r.res.Rate = r.fl.rate()
	r.rep.have = r.have
	if r.f.Progress != nil {
		r.f.Progress(r.have, r.size)
	}
}

// report sends the fetch's progress to the local node.
func (r *chunkRun) report() {
	r.res.Rate = r.fl.rate()
	r.rep.send(StateFetching, nil)
}
