package appliance

import (
	"slices"
	"time"

	"github.com/meshbox/meshbox/appliance/modules"
	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/node"
)

// healthEvery is how often the node looks at its own status to share
// its health summary with its peers (node.Health): a change of state
// reaches them within this and a round trip; other changes go with the
// next discovery message.
const healthEvery = 15 * time.Second

// HealthOf is the health summary of a node whose status is st: failing
// when it cannot do its work (a node of a mesh whose broker link is not
// connected, or modules crash-loop or cannot start), warning when it has
// problems or warnings or its bindings do, ok otherwise.
func HealthOf(st Status) node.Health {
	h := node.Health{Broker: st.Broker.State, Bindings: st.Bindings.Source, Outbox: st.Outbox.Depth}
	if st.Bindings.FetchedAt != nil {
		h.BindingsAt = st.Bindings.FetchedAt.UTC()
	}
	warnings := slices.Clone(st.Problems) // the causes first
	if st.Bindings.Warning != "" {
		warnings = append(warnings, "bindings: "+st.Bindings.Warning)
	}
	warnings = append(warnings, st.Warnings...)
	h.Warnings = len(warnings)
	if len(warnings) > 0 {
		h.Warning = clip(printableText(warnings[0]), node.MaxHealthText)
	}
	for _, m := range st.Modules {
		switch m.State {
		case modules.StateCrashLooping, modules.StateFailed, modules.StateNotInCatalog:
			if len(h.Failing) < node.MaxHealthFailing {
				h.Failing = append(h.Failing, m.Module)
			}
		}
	}
	switch {
	case (st.Broker.State != bridge.StateConnected && !st.Standalone) || len(h.Failing) > 0:
		h.State = node.HealthFailing
	case h.Warnings > 0:
		h.State = node.HealthWarning
	default:
		h.State = node.HealthOK
	}
	return h
}

// shareHealth gives n the node's health summary now and every
// healthEvery until the appliance closes.
func (a *Appliance) shareHealth(n *node.Node) {
	defer a.wg.Done()
	t := time.NewTicker(healthEvery)
	defer t.Stop()
	for {
		n.SetHealth(HealthOf(a.Status()))
		select {
		case <-a.quit:
			return
		case <-t.C:
		}
	}
}

// clip cuts s to at most n bytes, at a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && (s[cut]&0xC0) == 0x80 {
		cut--
	}
	return s[:cut] + "…"
}

// printableText replaces control characters (a line break in an error's
// text, say) by spaces.
func printableText(s string) string {
	b := []rune(s)
	for i, r := range b {
		if r < 0x20 || r == 0x7f {
			b[i] = ' '
		}
	}
	return string(b)
}
