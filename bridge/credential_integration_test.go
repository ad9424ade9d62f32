package bridge_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/bridge/brokeradmin"
	"github.com/meshbox/meshbox/testing/meshtest"
	"github.com/meshbox/meshbox/testing/meshtest/natstest"
)

// perNodeMesh makes a vhost with the shared topology declared by the
// admin, and returns the admin and a func giving the broker URL of a
// credential.
func perNodeMesh(t *testing.T) (*brokeradmin.Admin, func(brokeradmin.Credential) string) {
	t.Helper()
	rmq := sharedRabbit(t)
	u, err := url.Parse(rmq.Vhost(t))
	if err != nil {
		t.Fatal(err)
	}
	vhost := strings.TrimPrefix(u.Path, "/")
	vhost, _ = url.PathUnescape(vhost)
	ctx := context.Background()
	a, err := brokeradmin.Connect(ctx, rmq.AdminURL(), vhost, brokeradmin.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.DeclareMesh(ctx); err != nil {
		t.Fatal(err)
	}
	return a, func(c brokeradmin.Credential) string {
		v := *u
		v.User = url.UserPassword(c.User, c.Password.Reveal())
		return v.String()
	}
}

func generation(t *testing.T, a *brokeradmin.Admin, node string, gen int) brokeradmin.Credential {
	t.Helper()
	c, err := a.CreateGeneration(context.Background(), node, gen, []string{bridge.AllStages})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.DeleteGeneration(context.Background(), node, gen) })
	return c
}

// TestCredentialSwitchLosesNoRequest calls between two nodes without a
// pause while first the caller and then the callee switch to a new
// broker user and the old user is deleted: no call fails, and each node
// reports the new user (and OnCredential says so).
func TestCredentialSwitchLosesNoRequest(t *testing.T) {
	a, urlOf := perNodeMesh(t)
	users := map[string]*atomic.Value{"alpha": {}, "beta": {}}
	onCred := func(name string) func(*bridge.Config) {
		return func(c *bridge.Config) {
			c.Routes = map[string]string{"echo": map[string]string{"alpha": "beta", "beta": "alpha"}[name]}
			c.OnCredential = func(user string) { users[name].Store(user) }
		}
	}
	alpha := newNode(t, "alpha", urlOf(generation(t, a, "alpha", 1)), onCred("alpha"))
	beta := newNode(t, "beta", urlOf(generation(t, a, "beta", 1)), onCred("beta"))
	alpha.waitConnected(t)
	beta.waitConnected(t)
	for _, n := range []*node{alpha, beta} {
		sub, err := n.client.Subscribe("cap.echo", func(m *nats.Msg) {
			time.Sleep(20 * time.Millisecond) // calls are open at the host while the switch runs
			_ = m.Respond(m.Data)
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	waitStandIn(t, alpha, "echo")
	waitStandIn(t, beta, "echo")

	var (
		stop     = make(chan struct{})
		wg       sync.WaitGroup
		ok, fail atomic.Int64
		mu       sync.Mutex
		failures []string
	)
	for _, n := range []*node{alpha, beta} {
		for w := range 4 {
			wg.Add(1)
			go func() { // caller: exits when stop is closed
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					body := fmt.Sprintf("%s-%d-%d", n.name, w, i)
					m, err := n.client.Request("cap.echo", []byte(body), 10*time.Second)
					if err == nil && string(m.Data) == body && m.Header.Get("Nats-Service-Error") == "" {
						ok.Add(1)
						continue
					}
					fail.Add(1)
					mu.Lock()
					if err != nil {
						failures = append(failures, err.Error())
					} else {
						_, text := natstest.ServiceError(m)
						failures = append(failures, text)
					}
					mu.Unlock()
				}
			}()
		}
	}
	meshtest.WaitFor(t, 10*time.Second, "calls flowing", func() bool { return ok.Load() > 50 })

	for _, n := range []*node{alpha, beta} {
		before := ok.Load()
		g2 := generation(t, a, n.name, 2)
		if err := n.b.SetURL(urlOf(g2)); err != nil {
			t.Fatal(err)
		}
		meshtest.WaitFor(t, 20*time.Second, n.name+" on its new user", func() bool {
			c := n.b.Status().Broker.Credential
			return c != nil && c.User == g2.User && c.State == bridge.CredentialInUse
		})
		if got, _ := users[n.name].Load().(string); got != g2.User {
			t.Errorf("%s: OnCredential got %q, want %q", n.name, got, g2.User)
		}
		if err := a.DeleteGeneration(context.Background(), n.name, 1); err != nil {
			t.Fatal(err)
		}
		meshtest.WaitFor(t, 10*time.Second, "calls flowing after the switch of "+n.name, func() bool { return ok.Load() > before+100 })
		st := n.b.Status().Broker
		if st.State != bridge.StateConnected || st.Credential.Generation != 2 || st.Credential.SwitchedAt.IsZero() {
			t.Errorf("%s after the switch: state %s, credential %+v", n.name, st.State, *st.Credential)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("calls: %d ok, %d failed", ok.Load(), fail.Load())
	if fail.Load() != 0 {
		t.Errorf("got %d failed calls during the switches, want 0: %v", fail.Load(), failures)
	}
}

// TestWrongBrokerPasswordIsRefusedNotRevoked: a node started with a
// wrong password for its broker user says its credential is refused (a
// wrong password, or no such user), not revoked: it never connected with
// it. The control: the right password connects.
func TestWrongBrokerPasswordIsRefusedNotRevoked(t *testing.T) {
	a, urlOf := perNodeMesh(t)
	cred := generation(t, a, "alpha", 1)
	right := cred.Password
	cred.Password = "wrong-password"
	alpha := newNode(t, "alpha", urlOf(cred), nil)
	meshtest.WaitFor(t, 20*time.Second, "credential refused", func() bool {
		st := alpha.b.Status().Broker
		return st.Credential != nil && st.Credential.State == bridge.CredentialRefused && strings.Contains(st.Reason, "credential refused")
	})
	st := alpha.b.Status().Broker
	if !strings.Contains(st.Reason, "a wrong password, or no such user") || strings.Contains(st.Reason, "revoked") {
		t.Errorf("reason %q, want it refused for a wrong password or no such user, not revoked", st.Reason)
	}
	_ = alpha.b.Close()
	cred.Password = right
	newNode(t, "alpha", urlOf(cred), nil).waitConnected(t)
}

// TestCredentialRevokedIsSaid deletes a connected node's broker user: the
// node says "credential revoked" (not connection refused) in its status
// and metric, and keeps answering local calls; given a new credential it
// connects again and says so.
func TestCredentialRevokedIsSaid(t *testing.T) {
	a, urlOf := perNodeMesh(t)
	reg := prometheus.NewRegistry()
	logged := &lineCounter{match: "broker credential revoked"}
	alpha := newNode(t, "alpha", urlOf(generation(t, a, "alpha", 1)), func(c *bridge.Config) {
		c.Metrics = reg
		logged.next = c.Logger.Handler()
		c.Logger = slog.New(logged)
	})
	alpha.waitConnected(t)
	sub, err := alpha.client.Subscribe("cap.local", func(m *nats.Msg) { _ = m.Respond([]byte("here")) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	if err := a.DeleteGeneration(context.Background(), "alpha", 1); err != nil {
		t.Fatal(err)
	}
	// The credential's state and the link's reason are set one after the
	// other: wait for the link to say it too.
	meshtest.WaitFor(t, 20*time.Second, "credential revoked", func() bool {
		st := alpha.b.Status().Broker
		return st.Credential != nil && st.Credential.State == bridge.CredentialRevoked && strings.Contains(st.Reason, "credential revoked")
	})
	st := alpha.b.Status().Broker
	if st.State != bridge.StateOffline || !strings.Contains(st.Reason, "credential revoked") || !strings.Contains(st.Reason, "403") {
		t.Errorf("got state %s reason %q, want offline with credential revoked (403)", st.State, st.Reason)
	}
	if st.Credential.User != "node.alpha.g1" || st.Credential.Generation != 1 {
		t.Errorf("got credential %+v, want node.alpha.g1", *st.Credential)
	}
	if v := gauge(t, reg, "meshbox_broker_credential_revoked"); v != 1 {
		t.Errorf("meshbox_broker_credential_revoked: got %v, want 1", v)
	}
	m, err := alpha.client.Request("cap.local", nil, 2*time.Second)
	if err != nil || string(m.Data) != "here" {
		t.Errorf("local call while revoked: got %v %v, want here", m, err)
	}
	// The link retries (each refusal counts as a link error); the
	// revocation is logged once, not once per retry.
	failures := counter(t, reg, "meshbox_errors_total", "link")
	meshtest.WaitFor(t, 20*time.Second, "three more refused logins", func() bool {
		return counter(t, reg, "meshbox_errors_total", "link") >= failures+3
	})
	if n := logged.count.Load(); n != 1 {
		t.Errorf("got %d log lines about the revoked credential, want 1", n)
	}

	g2 := generation(t, a, "alpha", 2)
	if err := alpha.b.SetURL(urlOf(g2)); err != nil {
		t.Fatal(err)
	}
	alpha.waitConnected(t)
	meshtest.WaitFor(t, 10*time.Second, "new credential in use", func() bool {
		c := alpha.b.Status().Broker.Credential
		return c.User == g2.User && c.State == bridge.CredentialInUse
	})
	if v := gauge(t, reg, "meshbox_broker_credential_revoked"); v != 0 {
		t.Errorf("meshbox_broker_credential_revoked after a new credential: got %v, want 0", v)
	}
}

// TestCredentialSwitchRefusedKeepsOld hands a node a credential the
// broker refuses: the node stays connected with its old one and says why,
// and takes the right credential when it comes.
func TestCredentialSwitchRefusedKeepsOld(t *testing.T) {
	a, urlOf := perNodeMesh(t)
	alpha := newNode(t, "alpha", urlOf(generation(t, a, "alpha", 1)), nil)
	alpha.waitConnected(t)
	g2 := generation(t, a, "alpha", 2)
	wrong := g2
	wrong.Password = "not-the-password"
	if err := alpha.b.SetURL(urlOf(wrong)); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 20*time.Second, "the new credential refused", func() bool {
		c := alpha.b.Status().Broker.Credential
		return strings.Contains(c.Reason, "new credential refused")
	})
	st := alpha.b.Status().Broker
	if st.State != bridge.StateConnected || st.Credential.User != "node.alpha.g1" || st.Credential.State != bridge.CredentialInUse {
		t.Errorf("after a refused switch: state %s, credential %+v; want connected on node.alpha.g1", st.State, *st.Credential)
	}
	if err := alpha.b.SetURL(urlOf(g2)); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 20*time.Second, "switched to node.alpha.g2", func() bool {
		c := alpha.b.Status().Broker.Credential
		return c.User == g2.User && c.State == bridge.CredentialInUse
	})
}

// gauge returns the value of a registered gauge.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// counter returns the value of a counter with label kind.
func counter(t *testing.T, reg *prometheus.Registry, name, kind string) float64 {
	t.Helper()
	return counterWith(t, reg, name, "kind", kind)
}

// counterWith returns the value of a counter whose label is value (0 when
// there is none).
func counterWith(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// lineCounter counts the log records whose message contains match and
// passes every record on to next.
type lineCounter struct {
	match string
	next  slog.Handler
	count atomic.Int64
}

func (h *lineCounter) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *lineCounter) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.match) {
		h.count.Add(1)
	}
	return h.next.Handle(ctx, r)
}

func (h *lineCounter) WithAttrs(as []slog.Attr) slog.Handler {
	return &lineCounterView{h, h.next.WithAttrs(as)}
}

func (h *lineCounter) WithGroup(g string) slog.Handler {
	return &lineCounterView{h, h.next.WithGroup(g)}
}

// lineCounterView is a lineCounter's handler with attributes or a group:
// it counts into the same counter.
type lineCounterView struct {
	c    *lineCounter
	next slog.Handler
}

func (v *lineCounterView) Enabled(ctx context.Context, l slog.Level) bool {
	return v.next.Enabled(ctx, l)
}

func (v *lineCounterView) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, v.c.match) {
		v.c.count.Add(1)
	}
	return v.next.Handle(ctx, r)
}

func (v *lineCounterView) WithAttrs(as []slog.Attr) slog.Handler {
	return &lineCounterView{v.c, v.next.WithAttrs(as)}
}

func (v *lineCounterView) WithGroup(g string) slog.Handler {
	return &lineCounterView{v.c, v.next.WithGroup(g)}
}
