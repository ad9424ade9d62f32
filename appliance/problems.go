package appliance

import (
	"fmt"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/cache"
)

// This file says what keeps a node of a mesh from its work, in words that
// name the cause and where to fix it (Status.Problems, and
// Readiness.Degraded): the other parts of the status say what is, these
// say why. A problem is computed from the node's state each time, so it
// leaves the status when its cause ends.

// problems returns the node's problems now, from st (every part of the
// status but Problems filled in). A standalone node has none of these.
func (a *Appliance) problems(st Status) []string {
	if st.Standalone {
		return []string{}
	}
	out := []string{}
	dbRefused := a.dbLoginRefused()
	if dbRefused != nil {
		p := "mesh database: " + dbRefused.Error() + "; fix the user or password in " + SettingSources("db")
		switch st.Bindings.Source {
		case cache.SourceNone:
			p += "; until then this node has no bindings, so no broker and no mesh"
		case cache.SourceCache:
			p += fmt.Sprintf("; until then it runs on its cached bindings (revision %d)", st.Bindings.Revision)
		}
		out = append(out, p)
	} else if a.cfg.DB != "" && st.Bindings.Source == cache.SourceCache {
		p := "mesh database: not answering; this node runs on its cached bindings"
		if e := st.Bindings.LastError; e != "" {
			p += " (" + e + ")"
		}
		out = append(out, p)
	}
	refused := false
	if c := st.Broker.Credential; c != nil && (c.State == bridge.CredentialRefused || c.State == bridge.CredentialRevoked) {
		refused = true
		out = append(out, a.credentialProblem(*c))
	}
	switch st.Broker.State {
	case bridge.StateNone:
		if dbRefused == nil { // else said above
			out = append(out, "broker: "+st.Broker.Reason)
		}
	case bridge.StateOffline:
		if !refused {
			out = append(out, "broker link offline: "+st.Broker.Reason)
		}
	case bridge.StateBlocked:
		out = append(out, "broker: it blocks this node's publishing (a resource alarm): "+st.Broker.Blocked)
	}
	return out
}

// credentialProblem says why the broker refuses the link's credential c
// and where it is fixed: where the broker URL comes from, an override
// (the broker setting) or the bindings.
func (a *Appliance) credentialProblem(c bridge.CredentialStatus) string {
	p := fmt.Sprintf("broker: it refuses user %s at login (a wrong password, or no such user on the broker)", c.User)
	if c.State == bridge.CredentialRevoked {
		p = fmt.Sprintf("broker: it refuses user %s, which it accepted before (a rotation revoked it, or the user was deleted)", c.User)
	}
	if c.Reason != "" {
		p += ": " + c.Reason
	}
	if a.cfg.Broker != "" {
		return p + "; the broker URL and its credential come from " + a.brokerOverride() +
			", which overrides the mesh's broker.url and this node's credential from its bindings: fix the password there, or remove the setting to use the bindings'"
	}
	return p + "; the credential comes from this node's bindings: the node takes a newer one from them when there is one (meshbox mesh node rotate " + a.cfg.Node + " makes one)"
}

// noBrokerReason says why a node of a mesh has no broker URL yet (the
// link's state is none): no bindings yet, and why, or bindings that name
// no broker.
func (a *Appliance) noBrokerReason(bs cache.Status) string {
	switch {
	case bs.Source != cache.SourceNone:
		return "no broker yet: the mesh's bindings name none (meshbox mesh setting set broker.url URL sets it)"
	case a.dbLoginRefused() != nil:
		return "no broker yet: this node has no bindings, because the mesh database refuses its login"
	case bs.LastError != "":
		return "no broker yet: this node has no bindings, because it cannot load them from the mesh database: " + bs.LastError
	}
	return "no broker yet: this node waits for its bindings from the mesh database"
}

// dbLoginRefused returns the mesh database's refusal of the node's login
// while it lasts; nil without a database.
func (a *Appliance) dbLoginRefused() error {
	if bd := a.parts().bindings; bd != nil && bd.db != nil {
		return bd.db.LoginRefused()
	}
	return nil
}
