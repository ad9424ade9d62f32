package wire

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/meshbox/meshbox/internal/names"
)

// This file is the broker's side of the protocol: exchanges, queues and
// routing keys, node users and their permissions, and the durable queues
// the admin declares for a node (queues.go). It is the one home of a
// node's identity on the broker: the name of
// its RabbitMQ user and the permissions that user gets. The admin commands
// (package brokeradmin) apply them; the bridge connects with them.
//
// The admin declares what is shared or what a node must not be able to
// delete or publish into directly: exchanges mesh and mesh.dlx, and queue
// mesh.dead bound to mesh.dlx with "#"; and each node's durable queues
// (NodeQueues), so that a node needs the right to configure no name an
// exchange could have (NodePermissions). A node declares those passively
// and declares only server-named queues of its own.
//
// A node binds its request, reply and system queues to mesh itself, with
// the keys of its own name (to.<n>.req.#, to.<n>.reply, to.<n>.sys.#). An
// older mesh routed them through an exchange per node, node.<n>, bound to
// mesh with to.<n>.# (NodeBindingKey) by the admin: that second exchange
// cost every request and every reply a routing step on the broker (about
// 35 µs each way on a 2-core machine, measured with raw clients: 12% of a
// round trip). A node whose broker user still has that older mesh's
// permissions keeps binding through node.<n> (topology.go); the admin
// deletes node.<n> when it gives the node the current permissions.
//
// What a node may bind rests on its topic permissions, and RabbitMQ checks
// those only on topic exchanges: with read on a direct exchange a node can
// bind any queue it may write with any key, topic permissions set on that
// exchange or not (measured on RabbitMQ 3.10: a node allowed stage a bound
// its queue cmd.a to a direct exchange with key cmd.b; the same binding on
// mesh was refused with 403). So mesh traffic stays on topic exchanges.

// The broker's shared names: the admin declares them (brokeradmin).
const (
	// MeshExchange is the topic exchange all mesh traffic is published to.
	MeshExchange = "mesh"
	// DeadLetterExchange is the topic exchange of dead letters.
	DeadLetterExchange = "mesh.dlx"
	// DeadLetterQueue holds the dead letters.
	DeadLetterQueue = "mesh.dead"
	// AllStages in a stage allow-list allows every stage.
	AllStages = "*"
)

// NodeExchange returns the topic exchange of node n.
func NodeExchange(n string) string { return "node." + n }

// NodeBindingKey returns the key that binds node n's exchange to mesh.
func NodeBindingKey(n string) string { return "to." + n + ".#" }

// ProbeKey is the system key of a probe (discovery protocol 5): a message
// to one node (to.<n>.sys.probe) with no body and no properties, published
// mandatory and without a confirm, so that the broker's "no route" (a
// basic.return) says that node n's system queue, exclusive to its
// connection, is gone. The addressee's bridge drops it unread.
const ProbeKey = "probe"

// brokerUserPrefix starts every node's broker user name.
const brokerUserPrefix = "node."

// BrokerUser returns the RabbitMQ user name of generation gen (1, 2, ...)
// of node n's credential: node.<n>.g<gen>. RabbitMQ holds one password per
// user, so rotating a credential makes the next generation's user, with the
// same permissions, and deletes the old user once the node has switched.
// The name never changes meaning: a broker user_id maps to exactly one node.
func BrokerUser(n string, gen int) string {
	return brokerUserPrefix + n + ".g" + strconv.Itoa(gen)
}

// ParseBrokerUser returns the node and generation of a broker user name
// made by BrokerUser; ok is false for any other name (the admin's, guest).
func ParseBrokerUser(user string) (node string, gen int, ok bool) {
	rest, ok := strings.CutPrefix(user, brokerUserPrefix)
	if !ok {
		return "", 0, false
	}
	i := strings.LastIndex(rest, ".g")
	if i < 0 {
		return "", 0, false
	}
	node, digits := rest[:i], rest[i+2:]
	gen, err := strconv.Atoi(digits)
	if err != nil || gen < 1 || strconv.Itoa(gen) != digits || names.Node(node) != nil {
		return "", 0, false
	}
	return node, gen, true
}

// Permissions are a node's rights on the mesh vhost: RabbitMQ's configure,
// write and read regular expressions (matched against exchange and queue
// names) and its topic permissions on exchange TopicExchange (matched
// against routing keys on publish, and binding keys on bind). Every pattern
// is anchored with ^...$ and uses only what Erlang's re and Go's regexp
// agree on.
type Permissions struct {
	Configure string
	Write     string
	Read      string

	TopicExchange string
	TopicWrite    string
	TopicRead     string
}

// NodePermissions returns the permissions of node n's broker user, for the
// stages the mesh allows it to consume (AllStages: every stage; none: no
// stage). With them the node can:
//
//   - declare only server-named queues (amq.gen-*): its request, reply
//     and system queues, exclusive to its connection. RabbitMQ refuses a
//     client any exchange or queue name under the reserved prefix amq.,
//     so the configure right names no exchange the node could declare;
//     but one: its claim queue node.<n>.claim (exclusive, never bound or
//     consumed: the claim on its name), on which it has no other right,
//     so that an exchange of that name could neither be published into
//     nor bound as a source;
//   - find (passively), bind and consume its durable queues, which the
//     admin declares (NodeQueues): node.<n>.events and the queues
//     cmd.<stage>, retry.<stage> and dead.<stage> of its allowed stages
//     (read and purge their dead letters); no other queue. A node allowed
//     every stage also declares stage queues itself (no admin knows every
//     stage's name beforehand); it may already publish every key a stage
//     queue's name could carry;
//   - publish on mesh (commands cmd.*, events evt.* with their lane
//     evo.<n>.* of its own name as BCC, broadcasts sys.*,
//     requests to.<m>.req.*, replies to.<m>.reply and addressed system
//     messages to.<m>.sys.* to any node m, and retry copies retry.<stage>
//     and dead letters dead.<stage> of its allowed stages) and on mesh.dlx
//     (dead letters);
//     not on the default exchange, whose write right cannot be scoped per
//     queue, and not into another node's exchange;
//   - bind its queues to mesh only with event keys (evt.<pattern> and
//     the lanes evo.<m>.<pattern> of any node m: a node may receive every
//     event, sealed for the scopes it holds), sys.#, the keys of its own
//     name (to.<n>.#, to.<n>.req.#, to.<n>.reply, to.<n>.sys.#) and
//     cmd.<allowed stage> (retry.<stage>, dead.<stage>).
//
// So it cannot consume, bind, purge or delete another node's queues (its
// server-named ones are exclusive to their connection), cannot consume a
// stage it is not allowed, cannot route another node's traffic to itself,
// and has no exchange of its own to publish through with keys its topic
// permissions refuse on mesh (RabbitMQ matches the configure, write and
// read patterns against names, not kinds: any queue name a node may
// configure is an exchange name it may declare too).
//
// What RabbitMQ cannot refuse it: a queue argument on a queue it declares.
// A dead-letter exchange needs only the write right on it (checked at
// declaration), and a node writes to mesh to publish at all; so a node can
// make the broker publish again what it may read, under the original
// sender's user_id. Receivers refuse those (replay.go).
//
// An older mesh's permissions (configure on node.<n>.* by name, and the
// exchange node.<n>) keep working with this version (topology.go); the
// admin applies these with `meshbox mesh node rotate --all` once every
// node runs it.
func NodePermissions(n string, stages []string) (Permissions, error) {
	if err := names.Node(n); err != nil {
		return Permissions{}, fmt.Errorf("node permissions: %w", err)
	}
	stageAlt, err := stageAlternatives(stages)
	if err != nil {
		return Permissions{}, fmt.Errorf("node permissions: %w", err)
	}
	node := regexp.QuoteMeta(n)
	configure := serverNamedPattern + `|node\.` + node + `\.claim`
	queues := serverNamedPattern + `|node\.` + node + `\.events`
	bindKeys := []string{`to\.` + node + `\.(#|req\.#|reply|sys\.#)`}
	// rows.<table>: the tables' logs (stream queues the admin makes),
	// written through mesh and read straight from the queue.
	topicWrite := `(cmd|evt|sys)\..+|evo\.` + node + `\..+|to\.[A-Za-z0-9_-]+\.(req\..+|reply|sys\..+)|rows\.[a-z0-9_-]+`
	if stageAlt != "" {
		stageQueues := `(cmd|retry|dead)\.` + stageAlt
		queues += `|` + stageQueues
		bindKeys = append(bindKeys, stageQueues)
		topicWrite += `|(retry|dead)\.` + stageAlt
		if stageAlt == allStagesPattern {
			configure += `|` + stageQueues
		}
	}
	return Permissions{
		Configure:     `^(` + configure + `)$`,
		Write:         `^(mesh|mesh\.dlx|` + queues + `)$`,
		Read:          `^(mesh|` + queues + `|rows\.[a-z0-9_-]+)$`,
		TopicExchange: MeshExchange,
		TopicWrite:    `^(` + topicWrite + `)$`,
		TopicRead:     `^(` + strings.Join(append([]string{`evt` + patternTokens, `evo\.[A-Za-z0-9_-]+` + patternTokens, `sys\.#`}, bindKeys...), "|") + `)$`,
	}, nil
}

// patternTokens matches the tokens of a binding key's topic pattern:
// topic tokens and AMQP's wildcards.
const patternTokens = `(\.([A-Za-z0-9_-]+|\*|#))+`

// serverNamedPattern matches the names RabbitMQ gives queues declared
// without one.
const serverNamedPattern = `amq\.gen-.*`

// allStagesPattern is stageAlternatives' pattern for AllStages.
const allStagesPattern = `(.+)`

// stageAlternatives returns the pattern matching the stages of an
// allow-list: "(.+)" for AllStages, "(a|b\.c)" for a list, "" for none.
func stageAlternatives(stages []string) (string, error) {
	var alts []string
	seen := map[string]bool{}
	for _, s := range stages {
		if s == AllStages {
			return allStagesPattern, nil
		}
		if err := names.Stage(s); err != nil {
			return "", err
		}
		if !seen[s] {
			seen[s] = true
			alts = append(alts, regexp.QuoteMeta(s))
		}
	}
	if len(alts) == 0 {
		return "", nil
	}
	return `(` + strings.Join(alts, "|") + `)`, nil
}

// Limits are the RabbitMQ user limits of a node's broker user: how many
// connections and channels it may hold open on the broker at once, so
// that no node can exhaust the broker for the others.
type Limits struct {
	MaxConnections int
	MaxChannels    int
}

// NodeLimits returns the limits of every node's broker user. A session
// holds two connections (publishing and consuming) and about eight
// channels: two publishing ones; on the consuming connection the two
// consume channels, the channel that declares stage queues, the stall
// checker's, and one for each dead-letter operation while it runs (see
// the package doc, Concurrency). After a link is cut, the broker keeps
// the old pair until it misses two heartbeats (Config.Heartbeat, 5 s),
// while the node reconnects within ReconnectMin..ReconnectMax: several
// pairs may overlap for seconds, and meshbox doctor opens one more
// connection with the same user. A credential rotation moves to another
// user. The limits leave that room several times over and still bound a
// node to a small share of a broker.
func NodeLimits() Limits {
	return Limits{MaxConnections: 32, MaxChannels: 256}
}
