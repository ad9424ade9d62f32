package e2e

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/nats-io/nats.go"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// metricSet is one scrape of a node's /metrics, parsed by the Prometheus
// text parser.
type metricSet map[string]*dto.MetricFamily

// scrape reads and parses a node's /metrics.
func scrape(t *testing.T, httpURL string) metricSet {
	t.Helper()
	resp, err := http.Get(httpURL + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: status %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

// value returns the value of the series of family name whose labels
// include labels ("k=v" pairs); ok is false when there is none. Counters,
// gauges and untyped metrics give their value, histograms their count.
func (ms metricSet) value(name string, labels ...string) (float64, bool) {
	mf, ok := ms[name]
	if !ok {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for _, kv := range labels {
			k, v, _ := strings.Cut(kv, "=")
			if have[k] != v {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		switch mf.GetType() {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue(), true
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue(), true
		case dto.MetricType_HISTOGRAM:
			return float64(m.GetHistogram().GetSampleCount()), true
		default:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// sum adds up every series of family name (0 when it has none).
func (ms metricSet) sum(name string) float64 {
	total := 0.0
	if mf, ok := ms[name]; ok {
		for _, m := range mf.GetMetric() {
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
		}
	}
	return total
}

// must returns the value of a series that must exist.
func (ms metricSet) must(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	v, ok := ms.value(name, labels...)
	if !ok {
		t.Fatalf("no series %s%v in /metrics", name, labels)
	}
	return v
}

// expectedMetrics are the meshbox_ metric families a node exports (the
// README lists them), with their types. The families in lazyMetrics have
// labels that name what happened (an error's kind, a request's outcome) and
// show up with the first such event.
var expectedMetrics = map[string]dto.MetricType{
	// appliance
	"meshbox_up":                     dto.MetricType_GAUGE,
	"meshbox_build_info":             dto.MetricType_GAUGE,
	"meshbox_log_messages_total":     dto.MetricType_COUNTER,
	"meshbox_backup_snapshots_total": dto.MetricType_COUNTER,
	// bindings (cache)
	"meshbox_bindings_revision":              dto.MetricType_GAUGE,
	"meshbox_bindings_age_seconds":           dto.MetricType_GAUGE,
	"meshbox_bindings_source":                dto.MetricType_GAUGE,
	"meshbox_bindings_db_up":                 dto.MetricType_GAUGE,
	"meshbox_bindings_stale":                 dto.MetricType_GAUGE,
	"meshbox_bindings_divergences_total":     dto.MetricType_COUNTER,
	"meshbox_bindings_changes_total":         dto.MetricType_COUNTER,
	"meshbox_bindings_load_errors_total":     dto.MetricType_COUNTER,
	"meshbox_bindings_revision_checks_total": dto.MetricType_COUNTER,
	"meshbox_cache_write_errors_total":       dto.MetricType_COUNTER,
	"meshbox_cache_quarantined_total":        dto.MetricType_COUNTER,
	// broker link (bridge)
	"meshbox_broker_state":                     dto.MetricType_GAUGE,
	"meshbox_broker_reconnects_total":          dto.MetricType_COUNTER,
	"meshbox_broker_dials_total":               dto.MetricType_COUNTER,
	"meshbox_submissions_overflowed_total":     dto.MetricType_COUNTER,
	"meshbox_submission_answers_held_total":    dto.MetricType_COUNTER,
	"meshbox_broker_blocked_total":             dto.MetricType_COUNTER,
	"meshbox_broker_credential_revoked":        dto.MetricType_GAUGE,
	"meshbox_broker_event_bindings":            dto.MetricType_GAUGE,
	"meshbox_broker_event_bind_failures_total": dto.MetricType_COUNTER,
	"meshbox_broker_events_kept_local_total":   dto.MetricType_COUNTER,
	"meshbox_messages_total":                   dto.MetricType_COUNTER,
	"meshbox_errors_total":                     dto.MetricType_COUNTER,
	"meshbox_request_duration_seconds":         dto.MetricType_HISTOGRAM,
	"meshbox_stalls":                           dto.MetricType_GAUGE,
	"meshbox_command_lease_extensions_total":   dto.MetricType_COUNTER,
	"meshbox_commands_deduplicated_total":      dto.MetricType_COUNTER,
	"meshbox_command_retries_total":            dto.MetricType_COUNTER,
	"meshbox_command_results_total":            dto.MetricType_COUNTER,
	"meshbox_command_batch_size":               dto.MetricType_HISTOGRAM,
	"meshbox_command_batch_splits_total":       dto.MetricType_COUNTER,
	"meshbox_dead_letters":                     dto.MetricType_GAUGE,
	"meshbox_outbox_depth":                     dto.MetricType_GAUGE,
	"meshbox_outbox_bytes":                     dto.MetricType_GAUGE,
	"meshbox_outbox_oldest_age_seconds":        dto.MetricType_GAUGE,
	// blob store (appliance/blobs)
	"meshbox_blobs":                    dto.MetricType_GAUGE,
	"meshbox_blobs_bytes":              dto.MetricType_GAUGE,
	"meshbox_blobs_pruned_total":       dto.MetricType_COUNTER,
	"meshbox_blob_requests_total":      dto.MetricType_COUNTER,
	"meshbox_blob_served_bytes_total":  dto.MetricType_COUNTER,
	"meshbox_blob_fetch_bytes_total":   dto.MetricType_COUNTER,
	"meshbox_blob_fetch_retries_total": dto.MetricType_COUNTER,
	"meshbox_blob_fetches_total":       dto.MetricType_COUNTER,
	"meshbox_blob_fetches_running":     dto.MetricType_GAUGE,
	// tables of rows (appliance/rows)
	"meshbox_rows_writes_total":    dto.MetricType_COUNTER,
	"meshbox_rows_published_total": dto.MetricType_COUNTER,
	"meshbox_rows_applied_total":   dto.MetricType_COUNTER,
	"meshbox_rows_snapshots_total": dto.MetricType_COUNTER,
	"meshbox_rows_refused_total":   dto.MetricType_COUNTER,
	"meshbox_rows_errors_total":    dto.MetricType_COUNTER,
	"meshbox_rows_pending":         dto.MetricType_GAUGE,
	"meshbox_rows_tables_alarmed":  dto.MetricType_GAUGE,

	"meshbox_mqtt_retained_recorded_total": dto.MetricType_COUNTER,
	"meshbox_mqtt_retained_applied_total":  dto.MetricType_COUNTER,
	"meshbox_mqtt_retained_refused_total":  dto.MetricType_COUNTER,
	"meshbox_mqtt_retained_errors_total":   dto.MetricType_COUNTER,
	"meshbox_mqtt_accept_errors_total":     dto.MetricType_COUNTER,
	// mesh view (node)
	"meshbox_peers":                    dto.MetricType_GAUGE,
	"meshbox_capabilities":             dto.MetricType_GAUGE,
	"meshbox_discovery_messages_total": dto.MetricType_COUNTER,
	"meshbox_discovery_rejected_total": dto.MetricType_COUNTER,
	"meshbox_discovery_errors_total":   dto.MetricType_COUNTER,
	// keys (appliance/keys): every kind of key event, from 0
	"meshbox_key_events_total": dto.MetricType_COUNTER,
	// modules (appliance/modules)
	"meshbox_module_up":             dto.MetricType_GAUGE,
	"meshbox_module_restarts_total": dto.MetricType_COUNTER,
	"meshbox_module_state":          dto.MetricType_GAUGE,
}

var lazyMetrics = map[string]bool{
	// One series per assigned module: none on a node without modules.
	"meshbox_module_up":             true,
	"meshbox_module_restarts_total": true,
	"meshbox_module_state":          true,
	"meshbox_log_messages_total":    true,
	// One series per result, with the first backup.
	"meshbox_backup_snapshots_total":   true,
	"meshbox_errors_total":             true,
	"meshbox_request_duration_seconds": true,
	"meshbox_discovery_rejected_total": true,
	// One series per kind and outcome of blob requests, with the first.
	"meshbox_blob_requests_total": true,
	// One series per stage that dedupes, with its first duplicate.
	"meshbox_commands_deduplicated_total": true,
	// One series per stage with a retry policy, with its first retry; per
	// stage hosted here, once its dead letters were counted.
	"meshbox_command_retries_total": true,
	"meshbox_dead_letters":          true,
	// One series per table and cause of a refused change, per kind of
	// failure, with the first.
	"meshbox_rows_refused_total": true,
	"meshbox_rows_errors_total":  true,
	// The MQTT retained state's, on a node with an MQTT listener only.
	"meshbox_mqtt_retained_recorded_total": true,
	"meshbox_mqtt_retained_applied_total":  true,
	"meshbox_mqtt_retained_refused_total":  true,
	"meshbox_mqtt_retained_errors_total":   true,
	// One series per cause of a failed accept on the MQTT listener.
	"meshbox_mqtt_accept_errors_total": true,
}

// TestMetricsScrape runs a two-node mesh on the real broker and database,
// scrapes both nodes' /metrics with the Prometheus text parser, checks the
// metrics against the status, and makes traffic flow: a bindings change, an
// event across the mesh, a request to the other node.
func TestMetricsScrape(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, RabbitMQ and two nodes")
	}
	t.Parallel()
	alpha, beta, db := twoNodeMesh(t)

	// Every documented family is there with its type, and no meshbox_
	// metric is left out of the list (the README is generated from it).
	ms := scrape(t, alpha.HTTPURL())
	var missing, unknown []string
	for name, typ := range expectedMetrics {
		mf, ok := ms[name]
		switch {
		case !ok && !lazyMetrics[name]:
			missing = append(missing, name)
		case !ok:
		case mf.GetType() != typ:
			t.Errorf("%s: got type %s, want %s", name, mf.GetType(), typ)
		}
	}
	for name := range ms {
		if _, ok := expectedMetrics[name]; !ok && strings.HasPrefix(name, "meshbox_") {
			unknown = append(unknown, name)
		}
	}
	sort.Strings(missing)
	sort.Strings(unknown)
	if len(missing) > 0 {
		t.Errorf("metrics missing from /metrics: %v", missing)
	}
	if len(unknown) > 0 {
		t.Errorf("meshbox_ metrics not in expectedMetrics (add them, and to the README): %v", unknown)
	}

	// The metrics say what the status says.
	st := meshtest.Status(t, alpha.HTTPURL())
	if v := ms.must(t, "meshbox_up"); v != 1 {
		t.Errorf("meshbox_up: got %v, want 1", v)
	}
	if v := ms.must(t, "meshbox_build_info", "version="+st.Version); v != 1 {
		t.Errorf("meshbox_build_info: got %v, want 1", v)
	}
	if v := ms.must(t, "meshbox_broker_state", "state=connected"); v != 1 {
		t.Errorf("meshbox_broker_state{state=connected}: got %v, want 1", v)
	}
	for _, s := range []string{"offline", "connecting"} {
		if v, _ := ms.value("meshbox_broker_state", "state="+s); v != 0 {
			t.Errorf("meshbox_broker_state{state=%s}: got %v, want 0", s, v)
		}
	}
	if v := ms.must(t, "meshbox_bindings_source", "source=db"); v != 1 {
		t.Errorf("meshbox_bindings_source{source=db}: got %v, want 1", v)
	}
	// The revision may move on while beta joins: compared on a scrape
	// between two statuses that agree.
	rev, revMetric := st.Bindings.Revision, ms.must(t, "meshbox_bindings_revision")
	for range 20 {
		before := meshtest.Status(t, alpha.HTTPURL()).Bindings.Revision
		revMetric = scrape(t, alpha.HTTPURL()).must(t, "meshbox_bindings_revision")
		if rev = meshtest.Status(t, alpha.HTTPURL()).Bindings.Revision; rev == before {
			break
		}
	}
	if revMetric != float64(rev) {
		t.Errorf("meshbox_bindings_revision: got %v, want %d (status)", revMetric, rev)
	}
	if v := ms.must(t, "meshbox_bindings_db_up"); v != 1 {
		t.Errorf("meshbox_bindings_db_up: got %v, want 1", v)
	}
	if v := ms.must(t, "meshbox_outbox_depth"); v != 0 {
		t.Errorf("meshbox_outbox_depth: got %v, want 0", v)
	}
	up := 0
	for _, p := range st.Peers {
		if p.State == "up" {
			up++
		}
	}
	if v, _ := ms.value("meshbox_peers", "state=up"); v != float64(up) {
		t.Errorf("meshbox_peers{state=up}: got %v, want %d (status)", v, up)
	}

	// Traffic: a bindings change moves the change counter and the revision
	// on both nodes.
	before := map[string]metricSet{"alpha": ms, "beta": scrape(t, beta.HTTPURL())}
	mesh(t, db, "setting", "set", "forge.url", "https://forge.example.org")
	for _, p := range []*meshtest.Process{alpha, beta} {
		rev := before[p.Node()].must(t, "meshbox_bindings_revision")
		meshtest.WaitStatus(t, p.HTTPURL(), 5*time.Second, p.Node()+" applied the new revision", func(s appliance.Status) bool { return float64(s.Bindings.Revision) > rev })
		after := scrape(t, p.HTTPURL())
		if got, was := after.must(t, "meshbox_bindings_changes_total"), before[p.Node()].must(t, "meshbox_bindings_changes_total"); got <= was {
			t.Errorf("%s meshbox_bindings_changes_total: got %v after a change, was %v", p.Node(), got, was)
		}
		if got := after.must(t, "meshbox_bindings_revision"); got <= rev {
			t.Errorf("%s meshbox_bindings_revision: got %v, want above %v", p.Node(), got, rev)
		}
	}

	// Traffic: an event published on alpha reaches a program on beta; a
	// request from beta reaches a program on alpha.
	connect := func(p *meshtest.Process) *nats.Conn { return p.Connect(t) }
	onAlpha, onBeta := connect(alpha), connect(beta)
	events, err := onBeta.SubscribeSync("evt.door.>")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := onAlpha.QueueSubscribe("cap.echo", "meshbox", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	for _, nc := range []*nats.Conn{onAlpha, onBeta} {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	waitListening(t, beta, "evt.door.>", alpha)
	before = map[string]metricSet{"alpha": scrape(t, alpha.HTTPURL()), "beta": scrape(t, beta.HTTPURL())}

	const n = 3
	for i := range n {
		if err := onAlpha.Publish("evt.door.opened", []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		if _, err := events.NextMsg(10 * time.Second); err != nil {
			t.Fatalf("event %d did not reach beta: %v", i, err)
		}
	}
	var reply *nats.Msg
	meshtest.Poll(15*time.Second, func() bool { // alpha's capability may not be announced yet
		reply, err = onBeta.Request("node.alpha.cap.echo", []byte("ping"), 5*time.Second)
		return err == nil
	})
	if err != nil {
		t.Fatalf("request from beta to alpha's echo: %v", err)
	}
	if string(reply.Data) != "ping" {
		t.Fatalf("reply: got %q, want ping", reply.Data)
	}

	after := map[string]metricSet{"alpha": scrape(t, alpha.HTTPURL()), "beta": scrape(t, beta.HTTPURL())}
	moved := []struct {
		node, name string
		labels     []string
		atLeast    float64
	}{
		{"alpha", "meshbox_messages_total", []string{"shape=event", "direction=out"}, n},
		{"beta", "meshbox_messages_total", []string{"shape=event", "direction=in"}, n},
		{"beta", "meshbox_messages_total", []string{"shape=request", "direction=out"}, 1},
		{"alpha", "meshbox_messages_total", []string{"shape=request", "direction=in"}, 1},
		{"alpha", "meshbox_messages_total", []string{"shape=reply", "direction=out"}, 1},
		{"beta", "meshbox_messages_total", []string{"shape=reply", "direction=in"}, 1},
		{"beta", "meshbox_request_duration_seconds", []string{"outcome=ok"}, 1},
	}
	for _, m := range moved {
		was, _ := before[m.node].value(m.name, m.labels...)
		got, ok := after[m.node].value(m.name, m.labels...)
		if !ok {
			t.Errorf("%s %s%v: no series after traffic", m.node, m.name, m.labels)
			continue
		}
		if got-was < m.atLeast {
			t.Errorf("%s %s%v: went from %v to %v, want it up by at least %v", m.node, m.name, m.labels, was, got, m.atLeast)
		}
	}

	// A request nobody can answer fails at once, and the failure is counted
	// by kind.
	errsBefore := after["beta"].sum("meshbox_errors_total")
	msg, err := onBeta.Request("node.gamma.cap.echo", []byte("ping"), 5*time.Second)
	if err != nil {
		t.Fatalf("request to a node that does not exist: %v, want an error reply", err)
	}
	if code := msg.Header.Get("Nats-Service-Error-Code"); code != "503" {
		t.Errorf("request to a node that does not exist: error code %q (%q), want 503", code, msg.Header.Get("Nats-Service-Error"))
	}
	final := scrape(t, beta.HTTPURL())
	if got := final.sum("meshbox_errors_total"); got <= errsBefore {
		t.Errorf("beta meshbox_errors_total: got %v after a failed request, was %v", got, errsBefore)
	}
	if _, ok := final["meshbox_errors_total"]; ok && final["meshbox_errors_total"].GetType() != expectedMetrics["meshbox_errors_total"] {
		t.Errorf("meshbox_errors_total: got type %s", final["meshbox_errors_total"].GetType())
	}

	// Warnings and errors logged are counted: at least as many as the
	// status still lists.
	for _, p := range []*meshtest.Process{alpha, beta} {
		listed := meshtest.Status(t, p.HTTPURL()).Errors
		if got := scrape(t, p.HTTPURL()).sum("meshbox_log_messages_total"); got < float64(len(listed)) {
			t.Errorf("%s meshbox_log_messages_total: got %v, want at least the %d the status lists", p.Node(), got, len(listed))
		}
	}
}
