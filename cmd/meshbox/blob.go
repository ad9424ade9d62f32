package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/meshbox/meshbox/appliance/blobs"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
)

// BlobCommand stores, fetches, lists and removes blobs: exact bytes kept
// in a node's JetStream object store and fetched from any node of the
// mesh in verified chunks.
type BlobCommand struct{ m *Main }

const blobUsage = `Usage: meshbox blob <command> [--server URL] [flags]

Commands:
  put FILE               store FILE in the local node's blob store; prints
                         its reference blob:<node>/<sha256>
  get REF [-o FILE]      fetch the blob REF from its node, in chunks through the
                         mesh, each verified; a FILE.part left by an interrupted
                         fetch is continued (default FILE: the SHA-256)
  list [--json]          the local node's blobs, oldest first
  rm REF|SHA256...       delete blobs from the local node's store
`

// envTamperChunks is a test hook: chunk numbers (comma-separated) whose
// first arrival blob get corrupts before verifying it, so that tests can
// see a corrupted chunk detected and fetched again.
const envTamperChunks = "MESHBOX_TEST_TAMPER_CHUNKS"

// blobCommands are blob's subcommands.
func blobCommands() []command {
	// Each defines the flags all of them take (blob's commands have
	// always shared them), and checks its own arguments.
	leaf := func(name, synopsis string, run func(c *BlobCommand, ctx context.Context, f blobFlags, pos []string) error) command {
		return command{name: name, synopsis: synopsis, values: map[string]word{"o": wordFile},
			flags: func(m *Main, fs *flag.FlagSet) action {
				c := &BlobCommand{m: m}
				f := blobFlags{server: m.serverFlag(fs)}
				f.asJSON = fs.Bool("json", false, "print JSON (list)")
				f.out = fs.String("o", "", "output file (get; default: the blob's SHA-256 in the current directory)")
				f.patience = fs.Duration("patience", blobs.DefaultPatience, "how long get keeps trying while nothing arrives, once the fetch has begun")
				return func(ctx context.Context, pos []string) error { return run(c, ctx, f, pos) }
			}}
	}
	return []command{
		leaf("put", "blob put FILE [--server URL] [flags]", func(c *BlobCommand, ctx context.Context, f blobFlags, pos []string) error {
			if len(pos) != 1 {
				return usagef("blob put: want one FILE, got %d arguments", len(pos))
			}
			return c.put(ctx, *f.server, pos[0])
		}),
		leaf("get", "blob get REF [-o FILE] [--server URL] [flags]", func(c *BlobCommand, ctx context.Context, f blobFlags, pos []string) error {
			if len(pos) != 1 {
				return usagef("blob get: want one REF, got %d arguments", len(pos))
			}
			ref, err := blobs.ParseRef(pos[0])
			if err != nil {
				return usagef("blob get: %v", err)
			}
			return c.get(ctx, *f.server, ref, *f.out, *f.patience)
		}),
		leaf("list", "blob list [--json] [--server URL] [flags]", func(c *BlobCommand, ctx context.Context, f blobFlags, pos []string) error {
			if len(pos) != 0 {
				return usagef("blob list takes no arguments")
			}
			return c.list(ctx, *f.server, *f.asJSON)
		}),
		leaf("rm", "blob rm REF|SHA256... [--server URL] [flags]", func(c *BlobCommand, ctx context.Context, f blobFlags, pos []string) error {
			if len(pos) == 0 {
				return usagef("blob rm: want REF or SHA256 arguments")
			}
			return c.rm(ctx, *f.server, pos)
		}),
	}
}

// blobFlags are the flags of blob's commands.
type blobFlags struct {
	server, out *string
	asJSON      *bool
	patience    *time.Duration
}

// local connects to the local node and binds its blob store (made first
// when create is true); node is the node's name. A node without a store has
// no blobs: store is nil then.
func (c *BlobCommand) local(ctx context.Context, server string, create bool) (nc *nats.Conn, store *blobs.Store, node string, maxBytes int64, err error) {
	st, _, err := c.m.nodeStatus(ctx, server)
	if err != nil {
		return nil, nil, "", 0, err
	}
	if st.Blobs != nil {
		maxBytes = st.Blobs.MaxBytes
	}
	nc, err = c.m.connectNode(server)
	if err != nil {
		return nil, nil, "", 0, err
	}
	if st.Blobs == nil {
		nc.Close()
		return nil, nil, "", 0, fmt.Errorf("node %s: %w (blobs.enabled is false)", st.Node, blobs.ErrNoStore)
	}
	if create {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := nc.RequestWithContext(rctx, blobs.SubjectOpen, nil)
		cancel()
		if se := wire.ErrorOf(resp.Header); err == nil && se != nil {
			err = errors.New(se.Text)
		}
		if err != nil {
			nc.Close()
			return nil, nil, "", 0, fmt.Errorf("node %s: make the blob store: %w", st.Node, err)
		}
	}
	store, err = blobs.Bind(ctx, nc)
	if errors.Is(err, blobs.ErrNoStore) && !create {
		return nc, nil, st.Node, maxBytes, nil
	}
	if err != nil {
		nc.Close()
		return nil, nil, "", 0, fmt.Errorf("node %s: %w", st.Node, err)
	}
	return nc, store, st.Node, maxBytes, nil
}

func (c *BlobCommand) put(ctx context.Context, server, file string) error {
	nc, store, node, maxBytes, err := c.local(ctx, server, true)
	if err != nil {
		return err
	}
	defer nc.Close()
	info, err := store.PutFile(ctx, file, maxBytes)
	if err != nil {
		return err
	}
	fmt.Fprintln(c.m.Stdout, blobs.Ref{Node: node, SHA256: info.SHA256})
	return nil
}

func (c *BlobCommand) get(ctx context.Context, server string, ref blobs.Ref, out string, patience time.Duration) error {
	if out == "" {
		out = ref.SHA256
	}
	tamper, err := tamperHook(c.m.Getenv(envTamperChunks))
	if err != nil {
		return err
	}
	nc, err := c.m.connectNode(server)
	if err != nil {
		return err
	}
	defer nc.Close()
	bar := newProgressBar(c.m.Stderr)
	f := &blobs.Fetcher{
		Conn: nc, Patience: patience, Tamper: tamper,
		Progress: bar.update,
		Note: func(format string, args ...any) {
			bar.line("meshbox: " + fmt.Sprintf(format, args...))
		},
	}
	start := time.Now()
	res, err := f.Fetch(ctx, ref, out)
	bar.done()
	if err != nil {
		return err
	}
	secs := time.Since(start).Seconds()
	fmt.Fprintf(c.m.Stdout, "%s: %d bytes, %d chunks (%d kept from a partial file, %d fetched, %d fetched again), %s in %.1f s; %d requests, %d tried again (%d after their deadline)\n",
		out, res.Size, res.Chunks, res.Kept, res.Fetched, res.Refetched, rateText(float64(res.Bytes)/max(secs, 1e-3)), secs,
		res.Requests, res.Retries, res.TimedOut)
	return nil
}

// rateText says a rate in bytes per second in the unit that suits it.
func rateText(perSec float64) string {
	switch {
	case perSec >= 1<<20:
		return fmt.Sprintf("%.1f MiB/s", perSec/(1<<20))
	case perSec >= 1<<10:
		return fmt.Sprintf("%.1f KiB/s", perSec/(1<<10))
	}
	return fmt.Sprintf("%.0f B/s", perSec)
}

func (c *BlobCommand) list(ctx context.Context, server string, asJSON bool) error {
	nc, store, node, _, err := c.local(ctx, server, false)
	if err != nil {
		return err
	}
	defer nc.Close()
	var list []blobs.Info
	if store != nil {
		if list, err = store.List(ctx); err != nil {
			return err
		}
	}
	if asJSON {
		type entry struct {
			Ref string `json:"ref"`
			blobs.Info
		}
		out := make([]entry, 0, len(list))
		for _, b := range list {
			out = append(out, entry{Ref: blobs.Ref{Node: node, SHA256: b.SHA256}.String(), Info: b})
		}
		enc := json.NewEncoder(c.m.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(c.m.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REF\tSIZE\tSTORED")
	for _, b := range list {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", blobs.Ref{Node: node, SHA256: b.SHA256}, b.Size, b.Modified.Format(time.RFC3339))
	}
	return tw.Flush()
}

func (c *BlobCommand) rm(ctx context.Context, server string, args []string) error {
	nc, store, node, _, err := c.local(ctx, server, false)
	if err != nil {
		return err
	}
	defer nc.Close()
	for _, a := range args {
		sum := a
		if strings.HasPrefix(a, "blob:") {
			ref, err := blobs.ParseRef(a)
			if err != nil {
				return usagef("blob rm: %v", err)
			}
			if ref.Node != node {
				return fmt.Errorf("blob rm: %s is on node %s; this is node %s", a, ref.Node, node)
			}
			sum = ref.SHA256
		} else if err := blobs.CheckSHA256(sum); err != nil {
			return usagef("blob rm: %v", err)
		}
		if store == nil {
			return fmt.Errorf("blob rm: %w: %s (node %s has no blobs)", blobs.ErrNotFound, sum, node)
		}
		if err := store.Remove(ctx, sum); err != nil {
			return err
		}
		fmt.Fprintf(c.m.Stdout, "removed %s\n", blobs.Ref{Node: node, SHA256: sum})
	}
	return nil
}

// tamperHook reads envTamperChunks: it corrupts the first arrival of each
// chunk named.
func tamperHook(v string) (func(int, []byte), error) {
	if v == "" {
		return nil, nil
	}
	var mu sync.Mutex
	left := map[int]bool{}
	for _, s := range strings.Split(v, ",") {
		i, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || i < 0 {
			return nil, fmt.Errorf("%s: %q is not a chunk number", envTamperChunks, s)
		}
		left[i] = true
	}
	return func(i int, data []byte) {
		mu.Lock()
		defer mu.Unlock()
		if left[i] && len(data) > 0 {
			delete(left, i)
			data[len(data)/2] ^= 0xff
		}
	}, nil
}

// progressBar draws a fetch's progress on a terminal (and nothing
// elsewhere), at most ten times a second: bytes done of the blob's, and
// the rate over the last seconds. Notes are printed as lines.
type progressBar struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	last  time.Time
	drawn bool
	rate  rateMeter
}

// rateMeter is a rate over the last rateSpan: bytes done now and then.
type rateMeter struct {
	at   []time.Time
	have []int64
}

const rateSpan = 5 * time.Second

// add records have bytes done at now and returns the rate since the
// oldest point within rateSpan (0 with one point).
func (m *rateMeter) add(now time.Time, have int64) float64 {
	m.at, m.have = append(m.at, now), append(m.have, have)
	for len(m.at) > 2 && now.Sub(m.at[1]) >= rateSpan {
		m.at, m.have = m.at[1:], m.have[1:]
	}
	d := now.Sub(m.at[0]).Seconds()
	if d <= 0 {
		return 0
	}
	return float64(have-m.have[0]) / d
}

func newProgressBar(w io.Writer) *progressBar {
	p := &progressBar{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

func (p *progressBar) update(have, size int64) {
	if !p.tty {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Since(p.last) < 100*time.Millisecond && have < size {
		return
	}
	p.last = time.Now()
	const width = 30
	frac := 1.0
	if size > 0 {
		frac = float64(have) / float64(size)
	}
	n := int(frac * width)
	rate := p.rate.add(p.last, have)
	fmt.Fprintf(p.w, "\r\033[K[%s%s] %5.1f%% %.1f/%.1f MiB %s",
		strings.Repeat("=", n), strings.Repeat(" ", width-n), 100*frac, float64(have)/(1<<20), float64(size)/(1<<20), rateText(rate))
	p.drawn = true
}

func (p *progressBar) line(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
	fmt.Fprintln(p.w, s)
}

func (p *progressBar) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

// fetchLine is one fetch of the node's clients as `meshbox status` shows
// it: how far it got and at what rate, or how it ended.
func fetchLine(f blobs.FetchStatus) string {
	v := f.Ref + " " + f.State
	frac := 0.0
	if f.Size > 0 {
		frac = float64(f.Have) / float64(f.Size)
	}
	switch f.State {
	case blobs.StateFetching:
		v += fmt.Sprintf(": %.1f of %.1f MiB (%.0f%%), %s, %s in flight", float64(f.Have)/(1<<20), float64(f.Size)/(1<<20), 100*frac,
			rateText(f.Rate), sizeText(f.Window))
	case blobs.StateDone:
		v += fmt.Sprintf(": %.1f MiB", float64(f.Size)/(1<<20))
		// A rate needs a time to divide by: a fetch the node heard of
		// only when it ended, from a fetcher that does not time itself,
		// has none.
		if d := f.Elapsed(); d > 0 {
			v += fmt.Sprintf(" in %s (%s)", secondsText(d), rateText(float64(f.Bytes)/d.Seconds()))
		}
	default:
		v += fmt.Sprintf(" at %.1f of %.1f MiB", float64(f.Have)/(1<<20), float64(f.Size)/(1<<20))
		if f.Cause != "" {
			v += " (" + f.Cause + ")"
		}
	}
	if r := f.Retries; r.Deadline+r.Unavailable+r.Corrupt > 0 {
		v += fmt.Sprintf("; tried again: %d after their deadline, %d unavailable, %d corrupt", r.Deadline, r.Unavailable, r.Corrupt)
	}
	if f.Error != "" {
		v += " — " + f.Error
	}
	return v
}

// secondsText says a duration in seconds, with the digits it needs: a
// fetch of a few milliseconds does not read as "0.0 s".
func secondsText(d time.Duration) string {
	if d < 100*time.Millisecond {
		return fmt.Sprintf("%.3f s", d.Seconds())
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// sizeText says a size in bytes in the unit that suits it.
func sizeText(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
