package cache

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// TestBrokerCredentialRedacted: the broker password never shows in a log
// line or a %v of the bindings.
func TestBrokerCredentialRedacted(t *testing.T) {
	b := Bindings{Node: "alpha", Broker: &BrokerCredential{Generation: 2, User: "node.alpha.g2", Password: "s3cret-pw"}}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "bindings", b, "cred", *b.Broker)
	out := buf.String() + fmt.Sprintf("%v %+v %#v", b, *b.Broker, *b.Broker)
	if strings.Contains(out, "s3cret-pw") {
		t.Errorf("password leaked: %s", out)
	}
}
