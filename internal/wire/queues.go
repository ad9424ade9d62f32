package wire

import (
	"fmt"
	"slices"

	"github.com/meshbox/meshbox/internal/names"
)

// QueueSpec is one of a node's durable queues, as the admin declares it
// (NodeQueues): its name, its arguments (x-queue-type among them) and the
// key that binds it to mesh.
type QueueSpec struct {
	Name string
	Args map[string]any
	Key  string // the queue's binding to mesh ("": none, its node binds it)
}

// NodeQueues returns the durable queues of node n for the stages the mesh
// allows it: its event queue node.<n>.events (unbound: the node binds it
// to the events its programs listen to, wire.EventBindingKeys), and for
// each allowed stage cmd.<stage>, retry.<stage> and dead.<stage>, bound
// with their own names. The node may find, bind and consume them but not
// declare them (NodePermissions), so the admin declares them when it adds
// the node, changes its stages or rotates its credential. Stage queues
// are bound as they are declared, so commands submitted before the stage's
// node first connects wait in them.
//
// A stage allow-list of AllStages names no stage: such a node declares
// its stage queues itself. The event queue the admin declares has no
// x-expires (one a node declares itself has): the node could not declare
// it again once its broker deleted it, after a week offline; `meshbox
// mesh node remove` deletes it instead.
func NodeQueues(n string, stages []string) ([]QueueSpec, error) {
	if err := names.Node(n); err != nil {
		return nil, fmt.Errorf("node queues: %w", err)
	}
	if _, err := stageAlternatives(stages); err != nil {
		return nil, fmt.Errorf("node queues: %w", err)
	}
	specs := []QueueSpec{{Name: EventQueue(n), Args: QuorumArgs(map[string]any{}, false)}}
	if slices.Contains(stages, AllStages) {
		return specs, nil
	}
	seen := map[string]bool{}
	for _, st := range stages {
		if seen[st] {
			continue
		}
		seen[st] = true
		specs = append(specs,
			QueueSpec{Name: StageQueue(st), Args: StageQueueArgs(false), Key: CommandKey(st)},
			QueueSpec{Name: RetryQueue(st), Args: RetryQueueArgs(st), Key: RetryKey(st)},
			QueueSpec{Name: DeadQueue(st), Args: DeadQueueArgs(), Key: DeadKey(st)})
	}
	return specs, nil
}

// StageDeliveryLimit is the stage queues' x-delivery-limit: a backstop
// above any retry budget, so that the runtime's own budget (with a reason)
// dead-letters first. A constant, so that every node and the admin declare
// the same arguments.
const StageDeliveryLimit = 1000

// QuorumGroupSize is the number of replicas a quorum queue is given when
// the broker setting names a cluster: the smallest group that keeps a
// majority with one broker node down.
const QuorumGroupSize = 3

// QuorumArgs adds to args what a node's quorum queues share: the type, and
// the initial group size when sized (a cluster of three or more; with
// fewer, RabbitMQ places a replica on every node).
func QuorumArgs(args map[string]any, sized bool) map[string]any {
	args["x-queue-type"] = "quorum"
	if sized {
		args["x-quorum-initial-group-size"] = int64(QuorumGroupSize)
	}
	return args
}

// StageQueueArgs are the arguments of a stage's queue cmd.<stage>.
func StageQueueArgs(sized bool) map[string]any {
	return QuorumArgs(map[string]any{
		"x-delivery-limit":       int64(StageDeliveryLimit),
		"x-dead-letter-exchange": DeadLetterExchange,
	}, sized)
}

// RetryQueueArgs are the arguments of a stage's retry queue retry.<stage>:
// what expires there (each copy has the delay of its attempt) goes back to
// cmd.<stage>.
func RetryQueueArgs(stage string) map[string]any {
	return map[string]any{
		"x-queue-type":              "quorum",
		"x-dead-letter-exchange":    MeshExchange,
		"x-dead-letter-routing-key": CommandKey(stage),
		// Not lost between the retry queue and the stage queue.
		"x-dead-letter-strategy": "at-least-once",
		"x-overflow":             "reject-publish",
	}
}

// DeadQueueArgs are the arguments of a stage's dead-letter queue.
func DeadQueueArgs() map[string]any { return map[string]any{"x-queue-type": "classic"} }

// A node's queues and the keys that route to them.

// RequestQueue is node n's request queue's name in the protocol (a
// request's reply-to, and its name on an older mesh's permissions).
func RequestQueue(n string) string { return "node." + n + ".requests" }

// ReplyQueue is where replies to node n's requests arrive (see RequestQueue).
func ReplyQueue(n string) string { return "node." + n + ".replies" }

// EventQueue is node n's durable event queue.
func EventQueue(n string) string { return "node." + n + ".events" }

// ClaimQueue is the queue whose exclusive declaration is node n's claim on
// its name.
func ClaimQueue(n string) string { return "node." + n + ".claim" }

// SystemQueue is where system messages for node n arrive (see RequestQueue).
func SystemQueue(n string) string { return "node." + n + ".system" }

// StageQueue is the queue of a stage's commands.
func StageQueue(stage string) string { return "cmd." + stage }

// CommandKey routes a command of stage.
func CommandKey(stage string) string { return "cmd." + stage }

// RetryQueue and RetryKey: a stage's retry copies.
func RetryQueue(stage string) string { return "retry." + stage }

// RetryKey routes a retry copy of stage's command to its retry queue.
func RetryKey(stage string) string { return "retry." + stage }

// DeadQueue and DeadKey: a stage's dead letters.
func DeadQueue(stage string) string { return "dead." + stage }

// DeadKey routes a dead letter of stage to its dead-letter queue.
func DeadKey(stage string) string { return "dead." + stage }
