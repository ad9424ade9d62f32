package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// redactedHostPart is the part of an AMQP URL that survives redaction:
// everything after the password.
func redactedHostPart(amqpURL string) string {
	_, after, _ := strings.Cut(amqpURL, "@")
	return after
}

func TestNodeFollowsBrokerSetting(t *testing.T) {
	t.Parallel()
	rmq := meshtest.RabbitMQ(t)
	first, second := rmq.Vhost(t), rmq.Vhost(t)
	db := meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", meshtest.NoCredential(first)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	p := meshtest.StartProcess(t, "--node", "alpha", "--db", db)
	st := meshtest.WaitStatus(t, p.HTTPURL(), 15*time.Second, "broker connected", func(s appliance.Status) bool { return s.Broker.State == "connected" })
	if !strings.Contains(st.Broker.URL, redactedHostPart(first)) {
		t.Fatalf("broker.url: got %q, want the first vhost %q", st.Broker.URL, redactedHostPart(first))
	}
	if strings.Contains(st.Broker.URL, "guest:guest") {
		t.Errorf("broker.url: got %q, want the password redacted", st.Broker.URL)
	}

	// Moving the broker is a database change; the node follows without a restart.
	mesh(t, db, "setting", "set", "broker.url", meshtest.NoCredential(second))
	meshtest.WaitStatus(t, p.HTTPURL(), 15*time.Second, "broker moved to the second vhost", func(s appliance.Status) bool {
		return s.Broker.State == "connected" && strings.Contains(s.Broker.URL, redactedHostPart(second))
	})
}
