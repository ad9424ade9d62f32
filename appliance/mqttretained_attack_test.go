package appliance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/meshbox/meshbox/appliance/blobs"
	"github.com/meshbox/meshbox/appliance/localnats"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/internal/wire"
)

// retainedRig is one node's parts of the retained mirror, real but for
// the broker: the embedded NATS server with an MQTT listener and the
// blob store, the node's tables on disk (no link: the test carries
// changes between rigs), and the mirror.
type retainedRig struct {
	t     *testing.T
	node  string
	dir   string
	srv   *localnats.Server
	progs *programs.Store
	eng   *rows.Engine
	mr    *retainedMirror
	reg   *prometheus.Registry
}

func newRetainedRig(t *testing.T, node string) *retainedRig {
	t.Helper()
	dir := t.TempDir()
	srv, err := localnats.Start(localnats.Options{Addr: "127.0.0.1:0", Node: node, DataDir: dir,
		BlobMaxBytes: blobs.DefaultMaxBytes, MQTT: &localnats.MQTTOptions{Addr: "127.0.0.1:0"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	admin, err := srv.Connect("test-admin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := blobs.Open(ctx, admin, blobs.Limits{MaxBytes: blobs.DefaultMaxBytes}); err != nil {
		t.Fatal(err)
	}
	progs, err := programs.Open(programs.Dir(dir))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := rows.Open(rows.Config{Node: node, Path: filepath.Join(dir, "rows.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	eng.SetTables(map[string]rows.TableSpec{wire.TableMQTTRetained: {}})
	rg := &retainedRig{t: t, node: node, dir: dir, srv: srv, progs: progs, eng: eng}
	rg.addProgram(programs.Program{Name: "sensor", MQTT: true, Publish: []string{"homeassistant.>"}})
	rg.startMirror()
	return rg
}

// startMirror starts (again) the node's mirror, after opts.
func (rg *retainedRig) startMirror(opts ...func(*retainedMirror)) {
	t := rg.t
	t.Helper()
	rg.reg = prometheus.NewRegistry()
	m, err := newRetainedMetrics(rg.reg)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := rg.srv.Connect(ownConnPrefix + "mqtt-retained")
	if err != nil {
		t.Fatal(err)
	}
	rg.mr = newRetainedMirror(rg.node, rg.srv.NATS().NodeName(), filepath.Join(rg.dir, retainedPendingFile),
		rg.eng, nc, rg.srv.Rights(), slog.New(slog.DiscardHandler), m)
	for _, o := range opts {
		o(rg.mr)
	}
	if err := rg.mr.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	mr := rg.mr
	t.Cleanup(func() { _ = mr.Close() })
}

func (rg *retainedRig) addProgram(p programs.Program) string {
	rg.t.Helper()
	creds, err := rg.progs.Put(p)
	if err != nil {
		rg.t.Fatal(err)
	}
	if _, err := rg.srv.Reload(); err != nil {
		rg.t.Fatal(err)
	}
	return creds
}

// conn connects as program p.
func (rg *retainedRig) conn(p programs.Program, creds string) *nats.Conn {
	rg.t.Helper()
	nk, err := nats.NkeyOptionFromSeed(creds)
	if err != nil {
		rg.t.Fatal(err)
	}
	nc, err := nats.Connect(rg.srv.URL(), nk, nats.CustomInboxPrefix(p.InboxPrefix()), nats.NoReconnect())
	if err != nil {
		rg.t.Fatal(err)
	}
	rg.t.Cleanup(nc.Close)
	return nc
}

// retain publishes a retained MQTT message as a device of program name.
func (rg *retainedRig) retain(name, topic, payload string) {
	t := rg.t
	t.Helper()
	user, password, err := rg.progs.MQTTLogin(name)
	if err != nil {
		t.Fatal(err)
	}
	o := mqtt.NewClientOptions().AddBroker("tcp://" + strings.TrimPrefix(rg.srv.MQTTURL(), "mqtt://")).
		SetClientID(name + "-dev").SetUsername(user).SetPassword(password).SetProtocolVersion(4).
		SetAutoReconnect(false).SetConnectTimeout(5 * time.Second)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("device %s connects: %v", name, tok.Error())
	}
	defer c.Disconnect(100)
	if tok := c.Publish(topic, 1, true, payload); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("device %s retains %s: %v", name, topic, tok.Error())
	}
}

// row is the retained message the table holds for subject (ok false:
// none, or no message).
func (rg *retainedRig) row(subject string) (localnats.Retained, rows.Cell, bool) {
	row := retainedRow(subject)
	cells, err := rg.eng.Store().Row(wire.TableMQTTRetained, row)
	if err != nil || len(cells) == 0 {
		return localnats.Retained{}, rows.Cell{}, false
	}
	r, sc, err := retainedOf(row, cells)
	return r, sc, err == nil
}

// waitRow waits until the table holds payload for subject.
func (rg *retainedRig) waitRow(subject, payload string, d time.Duration) {
	rg.t.Helper()
	for end := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if r, _, ok := rg.row(subject); ok && string(r.Payload) == payload {
			return
		}
		if time.Now().After(end) {
			r, _, ok := rg.row(subject)
			rg.t.Fatalf("%s: after %v the table holds %q (%v) for %s, want %q", rg.node, d, r.Payload, ok, subject, payload)
		}
	}
}

// stored is the store's message for subject (ok false: none).
func (rg *retainedRig) stored(subject string) (localnats.Retained, bool) {
	rg.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	msg, err := rg.mr.stream.GetLastMsgForSubject(ctx, localnats.RetainedSubjectPrefix+subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return localnats.Retained{}, false
	}
	if err != nil {
		rg.t.Fatal(err)
	}
	r, err := localnats.DecodeRetained(msg.Subject, msg.Header, msg.Data)
	if err != nil {
		rg.t.Fatal(err)
	}
	return r, true
}

// waitStored waits until the store holds payload for subject.
func (rg *retainedRig) waitStored(subject, payload string, d time.Duration) {
	rg.t.Helper()
	for end := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if r, ok := rg.stored(subject); ok && string(r.Payload) == payload {
			return
		}
		if time.Now().After(end) {
			r, ok := rg.stored(subject)
			rg.t.Fatalf("%s: after %v the store holds %q (%v) for %s, want %q", rg.node, d, r.Payload, ok, subject, payload)
		}
	}
}

func (rg *retainedRig) refused(cause string) float64 {
	var m dto.Metric
	if err := rg.mr.m.refused.WithLabelValues(cause).Write(&m); err != nil {
		rg.t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// carry applies to's missing changes of rg's table, as the mesh's sync
// does: every cell as written, then the change is announced.
func (rg *retainedRig) carry(to *retainedRig, subject string) {
	rg.t.Helper()
	row := retainedRow(subject)
	cells, err := rg.eng.Store().Row(wire.TableMQTTRetained, row)
	if err != nil {
		rg.t.Fatal(err)
	}
	wcs := map[string]rows.WireCell{}
	for f, c := range cells {
		wcs[f] = rows.WireCell{Stamp: c.Stamp, Node: c.Node, Deleted: c.Deleted, Value: c.Value}
	}
	to.apply(rows.Change{Table: wire.TableMQTTRetained, Row: row, Cells: rows.CellsOf(wcs)})
}

// apply applies ch to rg's table as a change read from the mesh's log.
func (rg *retainedRig) apply(ch rows.Change) {
	rg.t.Helper()
	off, _, err := rg.eng.Store().Offset(wire.TableMQTTRetained)
	if err != nil {
		rg.t.Fatal(err)
	}
	if _, err := rg.eng.Store().Apply(wire.TableMQTTRetained, []rows.Change{ch}, off+1); err != nil {
		rg.t.Fatal(err)
	}
	rg.mr.markDirty(ch.Row)
}

// TestRetainedForgedByBlobProgram: a program with the blob store's rights
// only makes the server answer one of its objects, carrying the headers
// of a store request naming a device, onto $MQTT.rmsgs.<topic>, through a
// direct get and through a push consumer. The mirror carries neither to
// the table (no other node gets them), not while running and not at its
// next start, though the stream stored them. The control: a device that
// may publish the topic retains it; the table carries it to another node,
// whose store then holds it.
func TestRetainedForgedByBlobProgram(t *testing.T) {
	alpha, beta := newRetainedRig(t, "alpha"), newRetainedRig(t, "beta")
	thief := programs.Program{Name: "thief", Blobs: true}
	tnc := alpha.conn(thief, alpha.addProgram(thief))
	const subject = "evt.homeassistant.sensor.x.config"
	const pushSubject = "evt.homeassistant.sensor.y.config"
	const rowless = "evt.homeassistant.sensor.z.config" // no row: the forgery stays in the stream

	// The device's own retained message of the topic the thief forges:
	// it comes back into alpha's store after the forgery.
	alpha.retain("sensor", strings.ReplaceAll(subject, ".", "/"), "mine")
	alpha.waitRow(subject, "mine", 5*time.Second)

	// The object's chunk: a message of the blob stream with the store's
	// headers.
	m := nats.NewMsg("$O." + blobs.Bucket + ".C.x")
	m.Header.Set("Nmqtt-RFlags", "3")
	m.Header.Set("Nmqtt-RSource", "sensor")
	m.Header.Set("Nmqtt-ROrigin", alpha.srv.NATS().NodeName())
	m.Data = []byte(`{"name":"forged"}`)
	if _, err := tnc.RequestMsg(m, 2*time.Second); err != nil {
		t.Fatalf("the thief stores its chunk: %v", err)
	}
	// Direct get, answered onto the store's subject.
	for _, s := range []string{subject, rowless} {
		get := nats.NewMsg("$JS.API.DIRECT.GET.OBJ_" + blobs.Bucket)
		get.Reply = localnats.RetainedSubjectPrefix + s
		get.Data = []byte(`{"last_by_subj":"$O.` + blobs.Bucket + `.C.x"}`)
		if err := tnc.PublishMsg(get); err != nil {
			t.Fatal(err)
		}
	}
	// A push consumer delivering onto the store's subject.
	cfg, _ := json.Marshal(map[string]any{"stream_name": "OBJ_" + blobs.Bucket, "config": map[string]any{
		"deliver_subject": localnats.RetainedSubjectPrefix + pushSubject, "filter_subject": "$O." + blobs.Bucket + ".C.x",
		"ack_policy": "none", "deliver_policy": "last", "inactive_threshold": int64(5 * time.Second)}})
	push := false
	if rep, err := tnc.Request("$JS.API.CONSUMER.CREATE.OBJ_"+blobs.Bucket, cfg, 2*time.Second); err == nil && !strings.Contains(string(rep.Data), `"error"`) {
		push = true
	} else if err == nil {
		t.Logf("the thief's push consumer was refused: %s", rep.Data)
	}

	// The attack landed in the store (it is a real one), and the mirror
	// put the device's message back.
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if alpha.refused("forged") >= 2 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the thief's direct get was not heard on the store's subjects")
		}
	}
	alpha.waitStored(subject, "mine", 5*time.Second)
	alpha.waitStored(rowless, `{"name":"forged"}`, time.Second)
	if push {
		// Whether the server delivers to a subject only the stream
		// captures depends on its interest rules: the test does not
		// rely on it, and checks the table below either way.
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if _, ok := alpha.stored(pushSubject); ok {
				t.Logf("the push consumer's delivery landed in the store too")
				break
			}
		}
	}

	// The control: a device that may publish the topic retains it, and
	// another node gets it.
	const good = "evt.homeassistant.sensor.good.config"
	alpha.retain("sensor", strings.ReplaceAll(good, ".", "/"), "real")
	alpha.waitRow(good, "real", 5*time.Second)
	alpha.carry(beta, good)
	beta.waitStored(good, "real", 5*time.Second)

	if r, _, _ := alpha.row(subject); string(r.Payload) != "mine" {
		t.Errorf("the table holds %q for %s, want the device's (the forgery is not carried)", r.Payload, subject)
	}
	for _, s := range []string{rowless, pushSubject} {
		if _, _, ok := alpha.row(s); ok {
			t.Errorf("the table holds the forged retained message of %s", s)
		}
	}
	if n := alpha.refused("forged"); n < 1 {
		t.Errorf("refused forged: %v, want at least 1", n)
	}

	// The next start reads the stream, which holds the forgeries: still
	// nothing of them reaches the table; the device's message stays.
	_ = alpha.mr.Close()
	alpha.startMirror()
	time.Sleep(500 * time.Millisecond)
	if r, _, _ := alpha.row(subject); string(r.Payload) != "mine" {
		t.Errorf("after a restart the table holds %q for %s, want the device's", r.Payload, subject)
	}
	for _, s := range []string{rowless, pushSubject} {
		if _, _, ok := alpha.row(s); ok {
			t.Errorf("after a restart the table holds the forged retained message of %s", s)
		}
	}
	if n := alpha.refused("forged") + alpha.refused("unverified"); n < 1 {
		t.Errorf("after a restart, refused forged and unverified: %v, want at least 1", n)
	}
	alpha.waitRow(good, "real", time.Second)
}

// peerWrite is the change a peer writes for r, every field with stamp
// st; only, when set, limits it to those fields.
func peerWrite(peer string, st rows.Stamp, r localnats.Retained, only ...string) rows.Change {
	set, del := retainedWrite(r)
	cells := map[string]rows.WireCell{}
	for f, v := range set {
		cells[f] = rows.WireCell{Stamp: st, Node: peer, Value: v}
	}
	for _, f := range del {
		cells[f] = rows.WireCell{Stamp: st, Node: peer, Deleted: true}
	}
	if len(only) > 0 {
		keep := map[string]rows.WireCell{}
		for _, f := range only {
			keep[f] = cells[f]
		}
		cells = keep
	}
	return rows.Change{Table: wire.TableMQTTRetained, Row: retainedRow(r.Subject), Cells: rows.CellsOf(cells)}
}

// TestRetainedPoisonRows: a peer writes rows whose subjects are no
// literal event subject (empty tokens, white space, wildcards, control
// characters, bytes that are not UTF-8). Each is refused as bad_row, and
// a device's retained message still reaches the other node's store
// within seconds. The control: the same without the poison.
func TestRetainedPoisonRows(t *testing.T) {
	const good = "evt.homeassistant.sensor.good.config"
	for _, poison := range []bool{false, true} {
		alpha, beta := newRetainedRig(t, "alpha"), newRetainedRig(t, "beta")
		bad := []string{"evt..x", "evt.", "evt.a b", "evt.*.b", "evt.>", "evt.a\x01b", "evt.a\x7fb", "evt.\xff\xfe"}
		if poison {
			st := rows.StampAt(time.Now())
			for _, s := range bad {
				beta.apply(peerWrite("mallory", st, localnats.Retained{Subject: s, Payload: []byte("poison")}))
			}
		}
		alpha.retain("sensor", strings.ReplaceAll(good, ".", "/"), "real")
		alpha.waitRow(good, "real", 5*time.Second)
		alpha.carry(beta, good)
		beta.waitStored(good, "real", 3*time.Second)
		if n := beta.refused("bad_row"); poison && n < float64(len(bad)) {
			t.Errorf("refused bad_row: %v, want at least %d (one per poison row)", n, len(bad))
		}
		if !poison && beta.refused("bad_row") != 0 {
			t.Errorf("control: refused bad_row %v, want 0", beta.refused("bad_row"))
		}
		// The store's write comes before its count: wait for the count.
		var m dto.Metric
		var err error
		for end := time.Now().Add(3 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			m = dto.Metric{}
			if err = beta.mr.m.applied.Write(&m); err != nil || m.GetCounter().GetValue() >= 1 || time.Now().After(end) {
				break
			}
		}
		if err != nil || m.GetCounter().GetValue() != 1 {
			t.Errorf("beta put %v retained messages into its store (%v), want 1: the device's", m.GetCounter().GetValue(), err)
		}
	}
}

// TestRetainedPartialWrite: a peer writes only the payload and qos of a
// row, newer than the device's whole write that alpha made. The other
// node does not put the forged payload into its store (the row is no
// whole write: bad_row); the next whole write of the topic is carried
// again. The control: a whole write by the peer, with every field, is
// carried (as any peer's write of the table is).
func TestRetainedPartialWrite(t *testing.T) {
	alpha, beta := newRetainedRig(t, "alpha"), newRetainedRig(t, "beta")
	const topic = "evt.homeassistant.sensor.plug.config"
	alpha.retain("sensor", strings.ReplaceAll(topic, ".", "/"), "real")
	alpha.waitRow(topic, "real", 5*time.Second)
	alpha.carry(beta, topic)
	beta.waitStored(topic, "real", 3*time.Second)

	forged := localnats.Retained{Subject: topic, Payload: []byte("forged"), QoS: 1}
	st := rows.StampAt(time.Now().Add(time.Second))
	ch := peerWrite("mallory", st, forged, retainedFieldPayload, retainedFieldQoS)
	beta.apply(ch)
	alpha.apply(ch)
	time.Sleep(300 * time.Millisecond)
	if r, _ := beta.stored(topic); string(r.Payload) != "real" {
		t.Errorf("beta's store holds %q after a partial write, want real", r.Payload)
	}
	if r, _ := alpha.stored(topic); string(r.Payload) != "real" {
		t.Errorf("alpha's store holds %q after a partial write, want real", r.Payload)
	}
	if n := beta.refused("bad_row"); n < 1 {
		t.Errorf("beta refused bad_row %v, want at least 1", n)
	}
	if _, sc, err := retainedOf(retainedRow(topic), mustRow(t, beta, topic)); err == nil || sc.Node != "mallory" {
		t.Errorf("the partial write is read as %v, attributed to %q: want refused, attributed to mallory", err, sc.Node)
	}

	// The next whole write (a later retain on alpha) is carried.
	time.Sleep(time.Until(st.Wall()) + 10*time.Millisecond)
	alpha.retain("sensor", strings.ReplaceAll(topic, ".", "/"), "real2")
	alpha.waitRow(topic, "real2", 5*time.Second)
	alpha.carry(beta, topic)
	beta.waitStored(topic, "real2", 3*time.Second)

	// The control: a whole write by the peer is carried.
	whole := peerWrite("mallory", rows.StampAt(time.Now().Add(time.Second)), forged)
	beta.apply(whole)
	beta.waitStored(topic, "forged", 3*time.Second)
}

func mustRow(t *testing.T, rg *retainedRig, subject string) map[string]rows.Cell {
	t.Helper()
	cells, err := rg.eng.Store().Row(wire.TableMQTTRetained, retainedRow(subject))
	if err != nil {
		t.Fatal(err)
	}
	return cells
}

// TestRetainedFailedWriteRetried: a device's retained publish whose write
// of the table fails (here: the node has no such table yet) is written
// once the table can take it, without a restart and without a new
// publish. The control: with the table, it is written at once.
func TestRetainedFailedWriteRetried(t *testing.T) {
	alpha := newRetainedRig(t, "alpha")
	const topic = "evt.homeassistant.sensor.late.config"
	alpha.retain("sensor", strings.ReplaceAll(topic, ".", "/"), "now")
	alpha.waitRow(topic, "now", 5*time.Second) // the control

	alpha.eng.SetTables(map[string]rows.TableSpec{})
	alpha.retain("sensor", strings.ReplaceAll(topic, ".", "/"), "later")
	time.Sleep(300 * time.Millisecond)
	alpha.eng.SetTables(map[string]rows.TableSpec{wire.TableMQTTRetained: {}})
	if r, _, _ := alpha.row(topic); string(r.Payload) != "now" {
		t.Fatalf("the table holds %q while its write failed, want now", r.Payload)
	}
	alpha.waitRow(topic, "later", 2*retainedRetry)
}

// TestRetainedStreamBounded: the store's stream the node makes is
// bounded, and so is one made without a bound (as the server makes it
// at the first MQTT connection) once the mirror starts.
func TestRetainedStreamBounded(t *testing.T) {
	alpha := newRetainedRig(t, "alpha")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := alpha.mr.stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxBytes != DefaultMQTTRetainedMaxBytes {
		t.Errorf("the stream the node made holds at most %d bytes, want %d", info.Config.MaxBytes, DefaultMQTTRetainedMaxBytes)
	}
	cfg := info.Config
	cfg.MaxBytes = -1
	if _, err := alpha.mr.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	_ = alpha.mr.Close()
	alpha.startMirror()
	if info, err = alpha.mr.stream.Info(ctx); err != nil || info.Config.MaxBytes != DefaultMQTTRetainedMaxBytes {
		t.Errorf("an unbounded stream at start: then %d bytes (%v), want %d", info.Config.MaxBytes, err, DefaultMQTTRetainedMaxBytes)
	}
}

// TestRetainedQuotaPerWriter: a peer that writes more rows than its
// quota gets only its quota into another node's store (over_quota for
// the rest); the control: another writer's row still gets there.
func TestRetainedQuotaPerWriter(t *testing.T) {
	alpha, beta := newRetainedRig(t, "alpha"), newRetainedRig(t, "beta")
	_ = beta.mr.Close()
	beta.startMirror(func(mr *retainedMirror) { mr.quota = retainedUse{rows: 3, bytes: 1 << 20} })
	st := rows.StampAt(time.Now())
	for i := range 6 {
		beta.apply(peerWrite("mallory", st, localnats.Retained{Subject: fmt.Sprintf("evt.flood.t%d", i), Payload: []byte("x")}))
	}
	const good = "evt.homeassistant.sensor.good.config"
	alpha.retain("sensor", strings.ReplaceAll(good, ".", "/"), "real")
	alpha.waitRow(good, "real", 5*time.Second)
	alpha.carry(beta, good)
	beta.waitStored(good, "real", 3*time.Second)
	n := 0
	for i := range 6 {
		if _, ok := beta.stored(fmt.Sprintf("evt.flood.t%d", i)); ok {
			n++
		}
	}
	if n != 3 {
		t.Errorf("beta's store holds %d of mallory's 6 rows, want its quota of 3", n)
	}
	if got := beta.refused("over_quota"); got < 3 {
		t.Errorf("refused over_quota %v, want at least 3", got)
	}
}
