package bridge

import (
	"errors"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
)

// TestRequestTimeoutHeader: a caller's Meshbox-Timeout sets the deadline,
// shorter or longer than the default, up to wire.MaxTimeout (or the
// default, when that is longer); one that is not a positive duration is
// bad input.
func TestRequestTimeoutHeader(t *testing.T) {
	tests := []struct {
		def    time.Duration
		header string
		want   time.Duration
		bad    bool
	}{
		{5 * time.Second, "", 5 * time.Second, false},
		{5 * time.Second, "700ms", 700 * time.Millisecond, false},
		{5 * time.Second, "45s", 45 * time.Second, false},
		{5 * time.Second, "1h", wire.MaxTimeout, false},
		{10 * time.Minute, "1h", 10 * time.Minute, false},
		{5 * time.Second, "soon", 0, true},
		{5 * time.Second, "-1s", 0, true},
		{5 * time.Second, "0s", 0, true},
	}
	for _, tt := range tests {
		b := &Bridge{cfg: Config{RequestTimeout: tt.def, MaxPayload: DefaultMaxPayload}}
		msg := nats.NewMsg("cap.x")
		if tt.header != "" {
			msg.Header.Set(codec.HeaderTimeout, tt.header)
		}
		got, err := b.requestTimeout(msg)
		if tt.bad {
			if !errors.Is(err, codec.ErrBadInput) {
				t.Errorf("default %s, header %q: got %s, %v; want bad input", tt.def, tt.header, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("default %s, header %q: got %s, %v; want %s", tt.def, tt.header, got, err, tt.want)
		}
	}
}
