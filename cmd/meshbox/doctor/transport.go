package doctor

import (
	"context"
	"strings"

	"github.com/meshbox/meshbox/appliance"
)

// checkTransport: the links to the broker and the database cross the
// network; on another host they must be encrypted and authenticated
// (appliance.WeakTransport says when they are not).
func (d *Doctor) checkTransport(context.Context) Check {
	const name = "transport"
	broker, _ := d.brokerURL()
	problems := appliance.WeakTransport(broker, string(d.cfg.DB))
	if len(problems) > 0 {
		return fail(name, "anyone on the path can read or change the mesh's traffic: use amqps:// and sslmode=verify-full for hosts other than this one",
			"%s", strings.Join(problems, "; "))
	}
	if broker == "" && d.cfg.DB == "" {
		return ok(name, "no broker or database link: the node runs standalone")
	}
	return ok(name, "the broker and database links are encrypted or stay on this machine")
}

// checkNATSAccess: in a mesh the local NATS server lets in only programs
// with a credential; a standalone node (or nats_anonymous) lets anyone on
// this machine in, which is worth a warning.
func (d *Doctor) checkNATSAccess(context.Context) Check {
	const name = "local NATS access"
	open := !d.cfg.InMesh() || d.cfg.NATSAnonymous
	if d.status != nil && d.status.NATS.Auth != "" {
		open = d.status.NATS.Auth == appliance.AuthOpen
	}
	if open {
		return warn(name, "in a mesh the node asks every program for a credential (meshbox program add); nats_anonymous turns that off",
			"the local NATS server is open: any program on this machine can connect without a credential")
	}
	progs := "no programs"
	if d.status != nil && len(d.status.NATS.Programs) > 0 {
		progs = "programs: " + strings.Join(d.status.NATS.Programs, ", ")
	}
	return ok(name, "every program needs a credential (%s)", progs)
}
