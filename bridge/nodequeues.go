package bridge

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/internal/wire"
)

// The arguments of a node's queues are the protocol's (wire): the admin
// declares the same ones.

// stageQueueArgs are the arguments of a stage's queue cmd.<stage>.
func stageQueueArgs(sized bool) amqp.Table { return amqp.Table(wire.StageQueueArgs(sized)) }

// retryQueueArgs are the arguments of a stage's retry queue.
func retryQueueArgs(stage string) amqp.Table { return amqp.Table(wire.RetryQueueArgs(stage)) }

// deadQueueArgs are the arguments of a stage's dead-letter queue.
func deadQueueArgs() amqp.Table { return amqp.Table(wire.DeadQueueArgs()) }
