package bridge

import (
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ServerInterest returns a Config.Interest that lists the subscriptions of
// the embedded NATS server srv.
func ServerInterest(srv *server.Server) func() ([]Subscription, error) {
	return func() ([]Subscription, error) {
		sz, err := srv.Subsz(&server.SubszOptions{Subscriptions: true, Limit: 1 << 30})
		if err != nil {
			return nil, err
		}
		out := make([]Subscription, 0, len(sz.Subs))
		for _, sd := range sz.Subs {
			out = append(out, Subscription{Subject: sd.Subject, Queue: sd.Queue, ClientID: sd.Cid})
		}
		return out, nil
	}
}

// runReconciler keeps stand-ins and hosted stages in line with the local
// subscriptions and the routes. Exits when the bridge closes.
func (b *Bridge) runReconciler() {
	t := time.NewTicker(b.cfg.InterestPoll)
	defer t.Stop()
	for {
		select {
		case <-b.quit:
			return
		case <-t.C:
		case <-b.routesChanged:
		}
		b.reconcile()
	}
}

// reconcile reads the local interest and updates the stand-ins (one
// subscription to cap.<name> per capability routed elsewhere and not hosted
// by a local program: a local host always wins) and the hosted stages
// (Config.Stages plus every work.<stage> a local program subscribes).
func (b *Bridge) reconcile() {
	localCaps := map[string]bool{}
	hosted := map[string]bool{}
	for _, s := range b.cfg.Stages {
		hosted[s] = true
	}
	if b.cfg.Interest != nil {
		subs, err := b.cfg.Interest()
		if err != nil {
			b.interestFailing(err)
			return
		}
		b.interestFailing(nil)
		self, _ := b.bc.GetClientID()
		for _, s := range subs {
			if s.ClientID == self {
				continue
			}
			if name, ok := strings.CutPrefix(s.Subject, subjCapPrefix); ok && validName(name) {
				localCaps[name] = true
			}
			if stage, ok := strings.CutPrefix(s.Subject, subjWorkPrefix); ok && validName(stage) {
				hosted[stage] = true
			}
		}
	}
	b.routeMu.Lock()
	want := map[string]bool{}
	for name, nodes := range b.routes {
		if localCaps[name] {
			continue
		}
		for _, n := range nodes {
			if n != b.cfg.Node {
				want[name] = true
				break
			}
		}
	}
	for name, sub := range b.standins {
		if !want[name] {
			_ = sub.Unsubscribe()
			delete(b.standins, name)
		}
	}
	for name := range want {
		if _, ok := b.standins[name]; ok {
			continue
		}
		sub, err := b.bc.Subscribe(subjCapPrefix+name, b.onCapRequest)
		if err != nil {
			b.log.Error("cannot subscribe a stand-in", "capability", name, "err", err)
			continue
		}
		_ = sub.SetPendingLimits(1<<20, 256<<20)
		b.standins[name] = sub
	}
	b.localCaps = localCaps
	changed := !maps.Equal(hosted, b.hosted)
	for s := range hosted {
		if !b.hosted[s] {
			b.log.Info("stage hosted here", "stage", s)
		}
	}
	for s := range b.hosted {
		if !hosted[s] {
			b.log.Info("stage no longer hosted here", "stage", s)
		}
	}
	b.hosted = hosted
	b.routeMu.Unlock()
	_ = b.bc.Flush()
	if changed {
		signal(b.stagesChanged)
	}
}

// interestFailing logs a failing Interest once per streak.
func (b *Bridge) interestFailing(err error) {
	b.routeMu.Lock()
	was := b.interestErr
	b.interestErr = err != nil
	b.routeMu.Unlock()
	switch {
	case err != nil && !was:
		b.log.Error("cannot read the local subscriptions; hosted stages and stand-ins are not updated", "err", err)
	case err == nil && was:
		b.log.Info("local subscriptions readable again")
	}
}

// hostedStages returns a copy of the stages hosted here.
func (b *Bridge) hostedStages() map[string]bool {
	b.routeMu.RLock()
	defer b.routeMu.RUnlock()
	return maps.Clone(b.hosted)
}

// hostsStage reports whether stage is hosted here.
func (b *Bridge) hostsStage(stage string) bool {
	b.routeMu.RLock()
	defer b.routeMu.RUnlock()
	return b.hosted[stage]
}

// LocalCapabilities returns the capabilities local programs host, as last
// seen in the local subscriptions.
func (b *Bridge) LocalCapabilities() []string {
	b.routeMu.RLock()
	defer b.routeMu.RUnlock()
	return sortedKeys(b.localCaps)
}

// HostedStages returns the stages this node hosts.
func (b *Bridge) HostedStages() []string {
	b.routeMu.RLock()
	defer b.routeMu.RUnlock()
	return sortedKeys(b.hosted)
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
