package bridge

import (
	"fmt"
	"slices"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/internal/names"
)

// QueueSpec is one of a node's durable queues, as the admin declares it
// (NodeQueues): its name, its arguments (x-queue-type among them) and the
// key that binds it to mesh.
type QueueSpec struct {
	Name string
	Args map[string]any
	Key  string
}

// NodeQueues returns the durable queues of node n for the stages the mesh
// allows it: its event queue node.<n>.events (bound with evt.#), and for
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
	specs := []QueueSpec{{Name: eventQueue(n), Args: tableMap(quorumArgs(amqp.Table{}, false)), Key: "evt.#"}}
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
			QueueSpec{Name: stageQueue(st), Args: tableMap(stageQueueArgs(false)), Key: commandKey(st)},
			QueueSpec{Name: retryQueue(st), Args: tableMap(retryQueueArgs(st)), Key: retryKey(st)},
			QueueSpec{Name: deadQueue(st), Args: tableMap(deadQueueArgs()), Key: deadKey(st)})
	}
	return specs, nil
}

// stageQueueArgs are the arguments of a stage's queue cmd.<stage>.
func stageQueueArgs(sized bool) amqp.Table {
	return quorumArgs(amqp.Table{
		"x-delivery-limit":       int64(stageDeliveryLimit),
		"x-dead-letter-exchange": exchangeDLX,
	}, sized)
}

// retryQueueArgs are the arguments of a stage's retry queue retry.<stage>:
// what expires there (each copy has the delay of its attempt) goes back to
// cmd.<stage>.
func retryQueueArgs(stage string) amqp.Table {
	return amqp.Table{
		"x-queue-type":              "quorum",
		"x-dead-letter-exchange":    exchangeMesh,
		"x-dead-letter-routing-key": commandKey(stage),
		// Not lost between the retry queue and the stage queue.
		"x-dead-letter-strategy": "at-least-once",
		"x-overflow":             "reject-publish",
	}
}

// deadQueueArgs are the arguments of a stage's dead-letter queue.
func deadQueueArgs() amqp.Table { return amqp.Table{"x-queue-type": "classic"} }

func tableMap(t amqp.Table) map[string]any {
	m := make(map[string]any, len(t))
	for k, v := range t {
		m[k] = v
	}
	return m
}
