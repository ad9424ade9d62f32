package doctor

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/internal/brokerurl"
	"github.com/meshbox/meshbox/internal/wire"
)

// checkCredential looks at the credential the broker check connected with:
// it should be this node's own broker user (node.<n>.g<k>), and it must
// not have the admin's rights. The test of rights: declaring the mesh's
// shared exchange as it is (a no-op for whoever may) is refused to a
// node's user, which has configure rights on its own queues only.
func (d *Doctor) checkCredential(context.Context) Check {
	const name = "broker credential"
	conn := d.brokerConn
	if conn == nil {
		return d.credentialFromNode(name)
	}
	defer conn.Close()
	raw, _ := d.brokerURL()
	if urls := brokerurl.Split(raw); len(urls) > 0 {
		raw = urls[0] // every URL of a list has the same user
	}
	user := "guest" // what an AMQP URL without a user means
	if u, err := url.Parse(raw); err == nil && u.User != nil && u.User.Username() != "" {
		user = u.User.Username()
	}
	powerful, err := mayConfigureMesh(conn)
	if err != nil {
		return warn(name, "run doctor again", "could not test the rights of %s: %v", user, err)
	}
	owner, gen, own := wire.ParseBrokerUser(user)
	switch {
	case own && owner != d.cfg.Node:
		return fail(name, "the node's configuration or cache holds another node's credential; join this node with its own token (meshbox mesh node add, meshbox join)",
			"broker user %s is node %s's, not node %s's", user, owner, d.cfg.Node)
	case own && powerful:
		return fail(name, "give the user only the permissions meshbox mesh node add gives (meshbox mesh node set-stages reapplies them)",
			"broker user %s may configure the mesh's shared exchange %s: it has more rights than a node's", user, wire.MeshExchange)
	case own:
		return ok(name, "this node's own broker user %s (generation %d) works and has no admin rights", user, gen)
	case powerful:
		return warn(name, "give the node its own broker user: meshbox mesh node add NAME --broker-admin URL, then meshbox join TOKEN; never put the admin credential in a node's configuration",
			"the node connects as %q, which may configure the mesh's shared exchange %s: the admin's credential, or one as powerful", user, wire.MeshExchange)
	default:
		return warn(name, "give the node its own broker user: meshbox mesh node add NAME --broker-admin URL, then meshbox join TOKEN",
			"the node connects as %q, a credential shared by the mesh, not a broker user of its own (node.%s.g<k>)", user, d.cfg.Node)
	}
}

// credentialFromNode judges the broker user the running node connects
// as, from its status: doctor has no connection of its own when the
// broker and the credential come from the bindings the node holds.
func (d *Doctor) credentialFromNode(name string) Check {
	if d.status == nil || d.status.Broker.State == "" || d.status.Broker.State == wire.StateNone {
		return ok(name, "not checked: no connection to the broker (see the broker check)")
	}
	b := d.status.Broker
	user, state := "", ""
	if c := b.Credential; c != nil {
		user, state = c.User, c.State
	}
	if user == "" && d.status.Identity != nil {
		user = d.status.Identity.BrokerUser
	}
	if user == "" {
		user = "guest" // what an AMQP URL without a user means
		if u, err := url.Parse(b.URL); err == nil && u.User != nil && u.User.Username() != "" {
			user = u.User.Username()
		}
	}
	owner, gen, own := wire.ParseBrokerUser(user)
	switch {
	case own && owner != d.cfg.Node:
		return fail(name, "the node's configuration or cache holds another node's credential; join this node with its own token (meshbox mesh node add, meshbox join)",
			"the running node connects as broker user %s, node %s's, not node %s's", user, owner, d.cfg.Node)
	case state == wire.CredentialRevoked || state == wire.CredentialRefused:
		return fail(name, "give the node a new credential: meshbox mesh node rejoin NAME --broker-admin URL, then meshbox join TOKEN",
			"the running node's broker user %s: %s (%s)", user, state, b.Credential.Reason)
	case own && b.State == wire.StateConnected:
		return ok(name, "the running node connects as its own broker user %s (generation %d)", user, gen)
	case own:
		return warn(name, "see the broker check and meshbox status", "the running node's broker user is its own, %s (generation %d); its link is %s", user, gen, b.State)
	default:
		return warn(name, "give the node its own broker user: meshbox mesh node add NAME --broker-admin URL, then meshbox join TOKEN",
			"the running node connects as %q, a credential shared by the mesh, not a broker user of its own (node.%s.g<k>)", user, d.cfg.Node)
	}
}

// mayConfigureMesh reports whether conn's user may declare the exchange
// mesh (as the admin declares it: a no-op when it exists so).
func mayConfigureMesh(conn *amqp.Connection) (bool, error) {
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	done := make(chan error, 1)
	go func() { // exits when the broker answers or the connection closes
		done <- ch.ExchangeDeclare(wire.MeshExchange, "topic", true, false, false, false, nil)
	}()
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		_ = conn.Close() // the declaration fails with it and the goroutine exits
		<-done
		return false, errors.New("no answer from the broker in 5s")
	}
	var ae *amqp.Error
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &ae) && ae.Code == amqp.AccessRefused:
		return false, nil
	default:
		return false, err
	}
}
