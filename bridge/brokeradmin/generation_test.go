package brokeradmin_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/bridge/brokeradmin"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// dialAs opens an AMQP connection to vhost as cred's user, closed in
// Cleanup.
func dialAs(tb testing.TB, r *meshtest.Rabbit, vhost string, cred brokeradmin.Credential) *amqp.Connection {
	tb.Helper()
	conn, err := dial(r, vhost, cred)
	if err != nil {
		tb.Fatalf("dial as %s: %v", cred.User, err)
	}
	tb.Cleanup(func() { conn.Close() })
	return conn
}

func dial(r *meshtest.Rabbit, vhost string, cred brokeradmin.Credential) (*amqp.Connection, error) {
	u := fmt.Sprintf("amqp://%s:%s@127.0.0.1:%d/%s", url.PathEscape(cred.User), url.PathEscape(cred.Password.Reveal()),
		r.Port(), url.PathEscape(vhost))
	return amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
}

// try returns the broker's verdict on op (0: allowed), see
// meshtest.BrokerVerdict.
func try(tb testing.TB, conn *amqp.Connection, op func(ch *amqp.Channel) error) int {
	tb.Helper()
	code, err := meshtest.BrokerVerdict(conn, op)
	if err != nil {
		tb.Fatal(err)
	}
	return code
}

func publish(exchange, key string, p amqp.Publishing) func(ch *amqp.Channel) error {
	return func(ch *amqp.Channel) error {
		return ch.PublishWithContext(context.Background(), exchange, key, false, false, p)
	}
}

// TestNodeCredentialPermissions connects with two nodes' credentials and
// checks what each may and may not do on the broker.
func TestNodeCredentialPermissions(t *testing.T) {
	a, r, vhost := newAdmin(t)
	ctx := context.Background()
	if err := a.DeclareMesh(ctx); err != nil {
		t.Fatal(err)
	}
	alphaCred, err := a.CreateGeneration(ctx, "alpha", 1, []string{"resize"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.DeleteGeneration(context.Background(), "alpha", 1) })
	betaCred, err := a.CreateGeneration(ctx, "beta", 1, []string{bridge.AllStages})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.DeleteGeneration(context.Background(), "beta", 1) })
	if alphaCred.User != "node.alpha.g1" || len(alphaCred.Password.Reveal()) < 32 {
		t.Fatalf("credential: got user %q and a %d-byte password", alphaCred.User, len(alphaCred.Password.Reveal()))
	}

	alpha := dialAs(t, r, vhost, alphaCred)
	beta := dialAs(t, r, vhost, betaCred)

	// beta declares its request queue (as its bridge does: server-named,
	// exclusive) and binds it and the event queue the admin declared to
	// mesh with keys of its own name.
	betaCh, err := beta.Channel()
	if err != nil {
		t.Fatal(err)
	}
	betaQ, err := betaCh.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatalf("beta declares a server-named queue: %v", err)
	}
	if err := betaCh.QueueBind(betaQ.Name, "to.beta.req.#", "mesh", false, nil); err != nil {
		t.Fatalf("beta binds its requests: %v", err)
	}
	if _, err := betaCh.QueueDeclarePassive("node.beta.events", true, false, false, false, nil); err != nil {
		t.Fatalf("beta finds the event queue the admin declared: %v", err)
	}
	if err := betaCh.QueueBind("node.beta.events", "evt.#", "mesh", false, nil); err != nil {
		t.Fatalf("beta binds its events: %v", err)
	}
	// beta, allowed every stage, declares a stage queue alpha is not
	// allowed.
	if _, err := betaCh.QueueDeclare("cmd.other", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatalf("beta declares stage queue cmd.other: %v", err)
	}
	betaReqs, err := betaCh.Consume(betaQ.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatalf("beta consumes its requests: %v", err)
	}
	alphaCh, err := alpha.Channel()
	if err != nil {
		t.Fatal(err)
	}
	alphaQ, err := alphaCh.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatalf("alpha declares a server-named queue: %v", err)
	}

	const allowed, refused, forged, locked = 0, amqp.AccessRefused, amqp.PreconditionFailed, amqp.ResourceLocked
	steps := []struct {
		name string
		op   func(ch *amqp.Channel) error
		want int
	}{
		// Its own queues, and the shared exchanges declared passively.
		{"declare a server-named queue", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare("", false, true, true, false, nil)
			return err
		}, allowed},
		{"bind own server-named queue to mesh with its own name", func(ch *amqp.Channel) error {
			return ch.QueueBind(alphaQ.Name, "to.alpha.req.#", "mesh", false, nil)
		}, allowed},
		{"find own events queue", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive("node.alpha.events", true, false, false, false, nil)
			return err
		}, allowed},
		{"bind own events to mesh evt.#", func(ch *amqp.Channel) error {
			return ch.QueueBind("node.alpha.events", "evt.#", "mesh", false, nil)
		}, allowed},
		{"passive declare of mesh", func(ch *amqp.Channel) error {
			return ch.ExchangeDeclarePassive("mesh", "topic", true, false, false, false, nil)
		}, allowed},
		{"find allowed stage queue", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive("cmd.resize", true, false, false, false, nil)
			return err
		}, allowed},
		{"bind allowed stage", func(ch *amqp.Channel) error { return ch.QueueBind("cmd.resize", "cmd.resize", "mesh", false, nil) }, allowed},
		{"consume allowed stage", func(ch *amqp.Channel) error {
			_, err := ch.Consume("cmd.resize", "", false, false, false, false, nil)
			return err
		}, allowed},
		{"find allowed stage's dead letters", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive("dead.resize", true, false, false, false, nil)
			return err
		}, allowed},
		// RabbitMQ cannot refuse a queue argument on a queue a node may
		// declare: a dead-letter exchange needs only the write right on
		// it. Receivers refuse what comes back that way (bridge/replay.go).
		{"declare a server-named queue with mesh as its DLX", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare("", false, true, true, false, amqp.Table{"x-dead-letter-exchange": "mesh"})
			return err
		}, allowed},

		// Names: the admin declares its durable queues; it may declare
		// none, and so no exchange of any of those names.
		{"declare own events queue", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare("node.alpha.events", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
			return err
		}, refused},
		{"declare allowed stage queue", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare("cmd.resize", true, false, false, false,
				amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(1000), "x-dead-letter-exchange": "mesh.dlx"})
			return err
		}, refused},
		{"declare a queue named after itself", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare("node.alpha.requests", false, true, true, false, nil)
			return err
		}, refused},
		{"declare a queue of a server-like name", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare("amq.gen-mine", false, true, true, false, nil)
			return err
		}, refused},
		{"declare an exchange named like its event queue", func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare("node.alpha.events", "fanout", false, true, false, false, nil)
		}, refused},
		{"declare an exchange named like its stage queue", func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare("cmd.resize", "direct", false, true, false, false, nil)
		}, refused},
		{"declare an exchange named like its server-named queue", func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(alphaQ.Name, "fanout", false, true, false, false, nil)
		}, refused},
		{"declare an exchange of its own name (an older mesh's)", func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare("node.alpha", "topic", true, false, false, false, nil)
		}, refused},
		{"declare a queue with an alternate exchange", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare("node.alpha.x", false, true, true, false, amqp.Table{"alternate-exchange": "mesh"})
			return err
		}, refused},
		// Its claim queue: exclusive, and inert as an exchange name.
		{"declare own claim queue", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare("node.alpha.claim", false, true, true, false, nil)
			return err
		}, allowed},
		{"declare beta's claim queue", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare("node.beta.claim", false, true, true, false, nil)
			return err
		}, refused},
		{"declare an exchange of its claim queue's name", func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare("node.alpha.claim", "fanout", false, true, false, false, nil)
		}, allowed},
		{"bind that exchange into mesh", func(ch *amqp.Channel) error {
			return ch.ExchangeBind("mesh", "#", "node.alpha.claim", false, nil)
		}, refused},
		{"publish into that exchange", publish("node.alpha.claim", "dead.other", amqp.Publishing{UserId: alphaCred.User}), refused},
		{"bind own queue to that exchange", func(ch *amqp.Channel) error {
			return ch.QueueBind(alphaQ.Name, "#", "node.alpha.claim", false, nil)
		}, refused},
		// Another node's server-named queue: exclusive to its connection.
		{"bind beta's request queue", func(ch *amqp.Channel) error {
			return ch.QueueBind(betaQ.Name, "to.alpha.req.#", "mesh", false, nil)
		}, locked},
		{"consume beta's request queue", func(ch *amqp.Channel) error {
			_, err := ch.Consume(betaQ.Name, "", true, false, false, false, nil)
			return err
		}, locked},
		{"delete beta's request queue", func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(betaQ.Name, false, false, false)
			return err
		}, locked},
		// Publishing on mesh with the keys of the topology.
		{"request to beta", publish("mesh", "to.beta.req.echo", amqp.Publishing{Body: []byte("hi"), UserId: alphaCred.User}), allowed},
		{"reply to beta", publish("mesh", "to.beta.reply", amqp.Publishing{UserId: alphaCred.User}), allowed},
		{"command for any stage", publish("mesh", "cmd.other", amqp.Publishing{UserId: alphaCred.User}), allowed},
		{"event", publish("mesh", "evt.door", amqp.Publishing{UserId: alphaCred.User}), allowed},
		{"dead letter", publish("mesh.dlx", "cmd.resize", amqp.Publishing{UserId: alphaCred.User}), allowed},

		// Another node's queues: consume, bind, purge, delete.
		{"consume beta's events", func(ch *amqp.Channel) error {
			_, err := ch.Consume("node.beta.events", "", false, false, false, false, nil)
			return err
		}, refused},
		{"get from beta's requests", func(ch *amqp.Channel) error {
			_, _, err := ch.Get(betaQ.Name, true)
			return err
		}, locked},
		{"purge beta's events", func(ch *amqp.Channel) error { _, err := ch.QueuePurge("node.beta.events", false); return err }, refused},
		{"delete beta's events", func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete("node.beta.events", false, false, false)
			return err
		}, refused},
		{"declare a queue in beta's name", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare("node.beta.system", false, true, true, false, nil)
			return err
		}, refused},
		{"bind beta's events elsewhere", func(ch *amqp.Channel) error {
			return ch.QueueBind("node.beta.events", "sys.#", "mesh", false, nil)
		}, refused},
		// Routing another node's traffic to itself.
		{"bind own queue to mesh to.beta.#", func(ch *amqp.Channel) error {
			return ch.QueueBind("node.alpha.events", "to.beta.#", "mesh", false, nil)
		}, refused},
		{"bind own queue to mesh to.beta.req.#", func(ch *amqp.Channel) error {
			return ch.QueueBind(alphaQ.Name, "to.beta.req.#", "mesh", false, nil)
		}, refused},
		{"bind own queue to mesh to.beta.reply", func(ch *amqp.Channel) error {
			return ch.QueueBind(alphaQ.Name, "to.beta.reply", "mesh", false, nil)
		}, refused},
		{"bind own queue to mesh #", func(ch *amqp.Channel) error { return ch.QueueBind("node.alpha.events", "#", "mesh", false, nil) }, refused},
		{"bind own queue to mesh cmd.#", func(ch *amqp.Channel) error {
			return ch.QueueBind("node.alpha.events", "cmd.#", "mesh", false, nil)
		}, refused},
		{"bind own queue to beta's exchange", func(ch *amqp.Channel) error {
			return ch.QueueBind("node.alpha.events", "#", "node.beta", false, nil)
		}, refused},
		{"bind own exchange to mesh", func(ch *amqp.Channel) error {
			return ch.ExchangeBind("node.alpha", "#", "mesh", false, nil)
		}, refused},
		// Stages outside its allow-list.
		{"declare a stage not allowed", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare("cmd.other", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
			return err
		}, refused},
		{"consume a stage not allowed", func(ch *amqp.Channel) error {
			_, err := ch.Consume("cmd.other", "", false, false, false, false, nil)
			return err
		}, refused},
		{"get from a stage not allowed", func(ch *amqp.Channel) error { _, _, err := ch.Get("cmd.other", false); return err }, refused},
		{"purge a stage not allowed", func(ch *amqp.Channel) error { _, err := ch.QueuePurge("cmd.other", false); return err }, refused},
		{"bind a stage not allowed", func(ch *amqp.Channel) error { return ch.QueueBind("cmd.other", "cmd.x", "mesh", false, nil) }, refused},
		// Exchanges: none to declare or delete, the default one not at all.
		{"declare mesh", func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare("mesh", "topic", true, false, false, false, nil)
		}, refused},
		{"delete mesh", func(ch *amqp.Channel) error { return ch.ExchangeDelete("mesh", false, false) }, refused},
		{"delete beta's exchange", func(ch *amqp.Channel) error { return ch.ExchangeDelete("node.beta", false, false) }, refused},
		{"publish on the default exchange", publish("", betaQ.Name, amqp.Publishing{UserId: alphaCred.User}), refused},
		{"publish into beta's exchange", publish("node.beta", "to.beta.req.echo", amqp.Publishing{UserId: alphaCred.User}), refused},
		{"publish with a key outside the topology", publish("mesh", "to.beta.x", amqp.Publishing{UserId: alphaCred.User}), refused},
		// A forged origin: RabbitMQ checks user_id against the connection.
		{"publish as beta", publish("mesh", "evt.door", amqp.Publishing{UserId: betaCred.User}), forged},
	}
	for _, st := range steps {
		if got := try(t, alpha, st.op); got != st.want {
			t.Errorf("alpha: %s: got code %d, want %d", st.name, got, st.want)
		}
	}

	// The request alpha sent went mesh -> beta's request queue,
	// with alpha's user as its validated origin.
	select {
	case d := <-betaReqs:
		if d.RoutingKey != "to.beta.req.echo" || d.UserId != alphaCred.User || string(d.Body) != "hi" {
			t.Errorf("beta got key %q user %q body %q, want to.beta.req.echo from %s", d.RoutingKey, d.UserId, d.Body, alphaCred.User)
		}
	case <-time.After(10 * time.Second):
		t.Error("beta got no request from alpha")
	}
}

// TestGenerations creates a second generation of a node's credential,
// checks both work, deletes the first: its connection is closed and it
// cannot connect again, while the second keeps working.
func TestGenerations(t *testing.T) {
	a, r, vhost := newAdmin(t)
	ctx := context.Background()
	if err := a.DeclareMesh(ctx); err != nil {
		t.Fatal(err)
	}
	g1, err := a.CreateGeneration(ctx, "gamma", 1, []string{"*"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.DeleteGeneration(context.Background(), "gamma", 1) })
	old := dialAs(t, r, vhost, g1)
	oldClosed := old.NotifyClose(make(chan *amqp.Error, 1))

	g2, err := a.CreateGeneration(ctx, "gamma", 2, []string{"*"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.DeleteGeneration(context.Background(), "gamma", 2) })
	if g2.User != "node.gamma.g2" || g2.Password == g1.Password {
		t.Fatalf("generation 2: user %q, same password as generation 1: %v", g2.User, g2.Password == g1.Password)
	}
	gens, err := a.Generations(ctx, "gamma")
	if err != nil || !slices.Equal(gens, []int{1, 2}) {
		t.Fatalf("generations: got %v, %v; want [1 2]", gens, err)
	}
	// make before break: the new generation connects while the old is open
	cur := dialAs(t, r, vhost, g2)

	if err := a.DeleteGeneration(ctx, "gamma", 1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-oldClosed:
	case <-time.After(15 * time.Second):
		t.Fatal("the old generation's connection stayed open after its user was deleted")
	}
	if c, err := dial(r, vhost, g1); err == nil {
		c.Close()
		t.Fatal("the deleted generation can still connect")
	} else if !errors.Is(err, amqp.ErrCredentials) {
		t.Errorf("dial with the deleted generation: got %v, want %v", err, amqp.ErrCredentials)
	}
	if code := try(t, cur, publish("mesh", "evt.x", amqp.Publishing{UserId: g2.User})); code != 0 {
		t.Errorf("generation 2 publishes: got code %d, want 0", code)
	}
	if err := a.DeleteGeneration(ctx, "gamma", 1); err != nil {
		t.Errorf("deleting a deleted generation: %v", err)
	}
	gens, err = a.Generations(ctx, "gamma")
	if err != nil || !slices.Equal(gens, []int{2}) {
		t.Fatalf("generations: got %v, %v; want [2]", gens, err)
	}
}
