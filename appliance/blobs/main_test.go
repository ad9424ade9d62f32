package blobs

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// nats.go v1.55.0 (the newest): ObjectStore.Put makes a JetStream
		// context of its own and, deferred, clears its status channel;
		// the goroutine that context started to watch that channel reads
		// it only once it runs, and when the Put ended first it reads a
		// nil channel and waits forever. Not ours to stop; one small
		// goroutine per Put that loses that race (seen once in many runs).
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
	)
}
