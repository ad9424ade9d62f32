package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance/rows"
)

// rowsWorkerDir is the worker example, from this package's directory.
const rowsWorkerDir = "../../docs/examples/rows-worker"

// TestRowsWorkerExamples runs the worker examples (docs/examples/
// rows-worker: Go, built with go build, and JavaScript on Node.js)
// against a mesh node, with the credential `meshbox program add workers
// --read tasks --write tasks` made. Each alone does every queued task
// (one whose claim's lease ran out too) and leaves a task another worker
// holds; then two Go workers and a JavaScript one share more tasks than
// a page of a list. Every task ends done with its input in upper case,
// claimed by a worker that ran, and each worker exits by itself.
func TestRowsWorkerExamples(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and a node")
	}
	t.Parallel()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not installed (%v): run `make services` (testing/services.sh) first", err)
	}
	jsDir, err := filepath.Abs(filepath.Join(rowsWorkerDir, "js"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(jsDir, "node_modules", "nats", "package.json")); err != nil {
		t.Fatalf("the JavaScript example's packages are not installed (%v): run `make services` (testing/services.sh) first", err)
	}
	goWorker := filepath.Join(t.TempDir(), "worker")
	build := exec.Command("go", "build", "-o", goWorker, ".")
	build.Dir = filepath.Join(rowsWorkerDir, "go")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build the Go worker: %v\n%s", err, out)
	}

	p, _ := rpNode(t, "tasks")
	code, out, errOut := cli(t, "program", "add", "workers", "--read", "tasks", "--write", "tasks", "--data", p.DataDir(), "--server", p.NATSURL())
	if code != 0 {
		t.Fatalf("program add: exit %d: %s %s", code, out, errOut)
	}
	m := regexp.MustCompile(`program workers: credential (\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("program add printed no credential: %s", out)
	}
	creds := m[1]
	admin := p.Connect(t)

	// A task held by a live worker elsewhere, and one whose worker is
	// gone (its lease ran out).
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	rpMust(t, admin, "tasks", rows.OpPut, rows.Request{Row: "held", Set: map[string]string{"status": "queued", "input": "held", "claim": "elsewhere", "lease": future}}, nil)
	addTasks := func(prefix string, n int) map[string]string {
		want := map[string]string{}
		for i := range n {
			key := fmt.Sprintf("%s%03d", prefix, i)
			input := fmt.Sprintf("task %s of %d", key, n)
			rpMust(t, admin, "tasks", rows.OpPut, rows.Request{Row: key, Set: map[string]string{"status": "queued", "input": input}}, nil)
			want[key] = strings.ToUpper(input)
		}
		return want
	}
	run := func(ctx context.Context, worker string) *exec.Cmd {
		args := []string{"--server", p.NATSURL(), "--nkey", creds, "--program", "workers", "--worker", worker}
		var cmd *exec.Cmd
		if strings.HasPrefix(worker, "js") {
			cmd = exec.CommandContext(ctx, node, append([]string{"worker.js"}, args...)...)
			cmd.Dir = jsDir
		} else {
			cmd = exec.CommandContext(ctx, goWorker, args...)
		}
		return cmd
	}
	// wait runs the workers to their end: each must exit 0 by itself
	// and say it found none left.
	wait := func(workers ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmds := map[string]*exec.Cmd{}
		outs := map[string]*strings.Builder{}
		for _, w := range workers {
			cmd := run(ctx, w)
			outs[w] = &strings.Builder{}
			cmd.Stdout, cmd.Stderr = outs[w], outs[w]
			if err := cmd.Start(); err != nil {
				t.Fatalf("start worker %s: %v", w, err)
			}
			cmds[w] = cmd
		}
		for _, w := range workers {
			err := cmds[w].Wait()
			if err != nil || !strings.Contains(outs[w].String(), w+": ") || !strings.Contains(outs[w].String(), "tasks done, none left") {
				t.Fatalf("worker %s: %v (context: %v)\n%s", w, err, ctx.Err(), outs[w])
			}
			t.Logf("worker %s: %s", w, tail(outs[w].String(), 1))
		}
	}
	// check: every task of want is done with its result, claimed by one
	// of workers; held is untouched.
	check := func(want map[string]string, workers ...string) {
		t.Helper()
		got := map[string]rows.RowDoc{}
		for after := ""; ; {
			var page rows.ListDoc
			rpMust(t, admin, "tasks", rows.OpList, rows.Request{After: after}, &page)
			for _, r := range page.Rows {
				got[r.Row] = r
			}
			if !page.More {
				break
			}
			after = page.Rows[len(page.Rows)-1].Row
		}
		for key, result := range want {
			r, ok := got[key]
			switch {
			case !ok:
				t.Errorf("task %s: gone", key)
			case r.Fields["status"] != "done" || r.Fields["result"] != result:
				t.Errorf("task %s: status %q result %q, want done and %q", key, r.Fields["status"], r.Fields["result"], result)
			case !strings.Contains(" "+strings.Join(workers, " ")+" ", " "+r.Fields["claim"]+" "):
				t.Errorf("task %s: claimed by %q, want one of %v", key, r.Fields["claim"], workers)
			}
		}
		h := got["held"].Fields
		if h["status"] != "queued" || h["claim"] != "elsewhere" || h["lease"] != future || h["result"] != "" {
			t.Errorf("task held (another worker's, its lease running): %v, want it untouched", h)
		}
	}

	// The JavaScript worker alone, then the Go one: each does its
	// tasks and the one whose lease ran out.
	for _, w := range []string{"js-1", "go-1"} {
		want := addTasks(w+"-", 6)
		rpMust(t, admin, "tasks", rows.OpPut, rows.Request{Row: w + "-stale", Set: map[string]string{"status": "queued", "input": "stale " + w, "claim": "gone", "lease": past}}, nil)
		want[w+"-stale"] = strings.ToUpper("stale " + w)
		wait(w)
		check(want, w)
	}

	// Three at once on more tasks than a list's page: they share them.
	changes, err := admin.SubscribeSync(rows.ChangedSubject("tasks", ">"))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Flush(); err != nil {
		t.Fatal(err)
	}
	want := addTasks("many-", rows.DefaultListLimit+30)
	wait("go-2", "go-3", "js-2")
	check(want, "go-2", "go-3", "js-2")
	// Who did what, from the changes the node published: each done once
	// at least, by a worker that claimed it.
	doneBy := map[string]int{}
	for {
		m, err := changes.NextMsg(time.Second)
		if err != nil {
			break
		}
		if strings.Contains(string(m.Data), `"status":"done"`) {
			doneBy[strings.TrimPrefix(m.Subject, rows.ChangedSubject("tasks", ""))]++
		}
	}
	for key := range want {
		if doneBy[key] == 0 {
			t.Errorf("task %s: no change with status done was published", key)
		}
	}
	// Two workers that claim a task at the same moment may both do it
	// (the examples say so); most tasks are done once.
	twice := 0
	for _, n := range doneBy {
		if n > 1 {
			twice++
		}
	}
	t.Logf("%d tasks, %d done more than once", len(want), twice)
	if twice > len(want)/4 {
		t.Errorf("%d of %d tasks done more than once: the claims do not keep workers apart", twice, len(want))
	}
}
