// Command worker takes tasks from a meshbox table of rows and does them.
//
// A task is a row of table tasks with status=queued and an input field.
// The worker lists the queued rows, claims one by writing claim=<worker>
// and lease=<until, RFC3339>, reads the row back and goes on only if its
// claim is the current one (of two claims, the later stamp wins), does
// the work (here: input in upper case), writes status=done and
// result=<output>, and exits once no task is left for it.
//
//	meshbox program add workers --read tasks --write tasks
//	go run . --server nats://127.0.0.1:4222 --nkey <credential> --program workers
//
// The work must be safe to do twice: two workers that claim a task at
// the same moment may both see their own claim before the later one
// arrives. The result is the same either way.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// The rows API: a JSON request on $MESH.rows.<table>.<op>, answered in
// JSON, or with an error in the headers Nats-Service-Error-Code and
// Nats-Service-Error.
type request struct {
	Row   string            `json:"row,omitempty"`
	Set   map[string]string `json:"set,omitempty"`
	Limit int               `json:"limit,omitempty"`
	After string            `json:"after,omitempty"` // list: go on past this row
}

type version struct {
	Value string `json:"value"`
	Stamp string `json:"stamp"`
}

type row struct {
	Row      string             `json:"row"`
	Fields   map[string]string  `json:"fields"`
	Versions map[string]version `json:"versions"`
}

type page struct {
	Rows []row `json:"rows"`
	More bool  `json:"more"`
}

type written struct {
	Stamp string `json:"stamp"`
}

// apiError is an error answer: 404 no such row or table, 400 bad input.
type apiError struct{ code, text string }

func (e *apiError) Error() string { return e.code + ": " + e.text }

type worker struct {
	nc     *nats.Conn
	table  string
	name   string
	lease  time.Duration
	settle time.Duration
}

func (w *worker) call(op string, req request, out any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	m, err := w.nc.Request("$MESH.rows."+w.table+"."+op, body, 10*time.Second)
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, req.Row, err)
	}
	if code := m.Header.Get("Nats-Service-Error-Code"); code != "" {
		return &apiError{code, m.Header.Get("Nats-Service-Error")}
	}
	return json.Unmarshal(m.Data, out)
}

// free says whether a worker may claim r: it is queued and nobody
// holds it (no claim, or a lease that ran out: that worker is gone).
func free(r row, now time.Time) bool {
	if r.Fields["status"] != "queued" {
		return false
	}
	if r.Fields["claim"] == "" {
		return true
	}
	until, err := time.Parse(time.RFC3339, r.Fields["lease"])
	return err != nil || now.After(until)
}

// claimable lists the table page by page and keeps the free rows.
func (w *worker) claimable() ([]row, error) {
	var out []row
	for after := ""; ; {
		var p page
		if err := w.call("list", request{Limit: 100, After: after}, &p); err != nil {
			return nil, err
		}
		for _, r := range p.Rows {
			if free(r, time.Now()) {
				out = append(out, r)
			}
		}
		if !p.More || len(p.Rows) == 0 {
			return out, nil
		}
		after = p.Rows[len(p.Rows)-1].Row
	}
}

// claim takes task key and returns the row as claimed; ok is false when
// the task is not (or no longer) this worker's.
func (w *worker) claim(key string) (r row, ok bool, err error) {
	get := func() error {
		r = row{}
		err := w.call("get", request{Row: key}, &r)
		if e := (*apiError)(nil); errors.As(err, &e) && e.code == "404" {
			r.Fields = map[string]string{} // deleted meanwhile: not free
			return nil
		}
		return err
	}
	// The list may be old: read the row now.
	if err := get(); err != nil || !free(r, time.Now()) {
		return r, false, err
	}
	var wr written
	until := time.Now().Add(w.lease).UTC().Format(time.RFC3339)
	if err := w.call("put", request{Row: key, Set: map[string]string{"claim": w.name, "lease": until}}, &wr); err != nil {
		return r, false, err
	}
	// Workers on other nodes: give their claims time to arrive.
	time.Sleep(w.settle)
	if err := get(); err != nil {
		return r, false, err
	}
	// Ours only if the claim is still the one we wrote: a later one wins.
	c := r.Versions["claim"]
	return r, c.Value == w.name && c.Stamp == wr.Stamp && r.Fields["status"] == "queued", nil
}

// do is the work.
func do(r row) string { return strings.ToUpper(r.Fields["input"]) }

func (w *worker) run() (int, error) {
	done := 0
	for {
		tasks, err := w.claimable()
		if err != nil {
			return done, err
		}
		if len(tasks) == 0 {
			return done, nil // none left for us
		}
		// In another order than the other workers: fewer lost claims.
		rand.Shuffle(len(tasks), func(i, j int) { tasks[i], tasks[j] = tasks[j], tasks[i] })
		for _, t := range tasks {
			r, ok, err := w.claim(t.Row)
			if err != nil {
				return done, err
			}
			if !ok {
				continue // another worker has it
			}
			result := do(r)
			// Bytes larger than a field (16 KiB) belong in a blob (the
			// program needs --blobs); the row then holds its name.
			if err := w.call("put", request{Row: t.Row, Set: map[string]string{"status": "done", "result": result}}, &written{}); err != nil {
				return done, err
			}
			done++
			log.Printf("%s: task %s done", w.name, t.Row)
		}
	}
}

func main() {
	server := flag.String("server", nats.DefaultURL, "the node's NATS server")
	nkey := flag.String("nkey", "", "the program's credential file (meshbox program add prints it)")
	program := flag.String("program", "", "the program's name: its answers come to its inbox, _INBOX.<program>")
	name := flag.String("worker", "", "this worker's name in its claims (default: <program>-<host>-<pid>)")
	table := flag.String("table", "tasks", "the table of tasks")
	lease := flag.Int("lease", 300, "seconds a claim holds: past them another worker may take the task")
	settle := flag.Int("settle", 0, "milliseconds to wait before reading a claim back (workers on several nodes: 1000)")
	flag.Parse()
	if *nkey == "" || *program == "" {
		log.Fatal("--nkey and --program are needed (meshbox program add NAME --read tasks --write tasks)")
	}
	if *name == "" {
		host, _ := os.Hostname()
		*name = fmt.Sprintf("%s-%s-%d", *program, host, os.Getpid())
	}
	auth, err := nats.NkeyOptionFromSeed(*nkey)
	if err != nil {
		log.Fatal(err)
	}
	// A program may receive only on its own inbox.
	nc, err := nats.Connect(*server, auth, nats.CustomInboxPrefix("_INBOX."+*program), nats.Name(*name))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	w := &worker{nc: nc, table: *table, name: *name,
		lease: time.Duration(*lease) * time.Second, settle: time.Duration(*settle) * time.Millisecond}
	n, err := w.run()
	if err != nil {
		log.Fatalf("%s: %v (after %d tasks)", *name, err, n)
	}
	log.Printf("%s: %d tasks done, none left", *name, n)
}
