package modules

import (
	"bufio"
	"io"
	"sync"
	"time"
)

// maxLine bounds one line of a module's output; the rest of a longer line
// is dropped.
const maxLine = 16 << 10

// LogLine is one line a module wrote.
type LogLine struct {
	Seq    uint64    `json:"seq"` // increases by one per line of this module, across its runs
	At     time.Time `json:"at"`
	Stream string    `json:"stream"` // stdout or stderr
	Text   string    `json:"text"`
}

// logRing keeps the last lines of one module. Safe for concurrent use.
type logRing struct {
	mu    sync.Mutex
	lines []LogLine // a ring of cap lines; next is where the next goes
	next  int
	full  bool
	seq   uint64
}

func newLogRing(n int) *logRing { return &logRing{lines: make([]LogLine, n)} }

// add stores a line and returns it with its sequence number.
func (r *logRing) add(stream, text string) LogLine {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	l := LogLine{Seq: r.seq, At: time.Now().UTC(), Stream: stream, Text: text}
	r.lines[r.next] = l
	r.next = (r.next + 1) % len(r.lines)
	if r.next == 0 {
		r.full = true
	}
	return l
}

// last returns up to n of the newest lines, oldest first (n <= 0: all kept).
func (r *logRing) last(n int) []LogLine {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []LogLine
	if r.full {
		out = append(out, r.lines[r.next:]...)
	}
	out = append(out, r.lines[:r.next]...)
	if n > 0 && len(out) > n {
		out = out[len(out)-n:]
	}
	return out
}

// readLines reads lines from rd until EOF or an error and hands each to
// sink, cut at maxLine.
func readLines(rd io.Reader, sink func(string)) {
	br := bufio.NewReaderSize(rd, 4096)
	var buf []byte
	for {
		chunk, isPrefix, err := br.ReadLine()
		if len(chunk) > 0 && len(buf) < maxLine {
			buf = append(buf, chunk[:min(len(chunk), maxLine-len(buf))]...)
		}
		if err != nil {
			if len(buf) > 0 {
				sink(string(buf))
			}
			return
		}
		if !isPrefix {
			sink(string(buf))
			buf = buf[:0]
		}
	}
}
