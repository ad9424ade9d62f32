package bridge

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
)

func TestRetryPolicyDelay(t *testing.T) {
	fixed := RetryPolicy{Attempts: 5, Backoff: time.Second}
	growing := RetryPolicy{Attempts: 9, Backoff: time.Second, MaxBackoff: 5 * time.Second}
	tests := []struct {
		p    RetryPolicy
		n    int
		want time.Duration
	}{
		{fixed, 1, time.Second},
		{fixed, 4, time.Second},
		{growing, 1, time.Second},
		{growing, 2, 2 * time.Second},
		{growing, 3, 4 * time.Second},
		{growing, 4, 5 * time.Second},
		{growing, 100, 5 * time.Second},
	}
	for _, tt := range tests {
		if got := tt.p.delay(tt.n); got != tt.want {
			t.Errorf("%+v delay(%d): got %s, want %s", tt.p, tt.n, got, tt.want)
		}
	}
}

func TestCheckRetry(t *testing.T) {
	tests := []struct {
		stage string
		p     RetryPolicy
		want  string // "" for valid
	}{
		{"invoices", RetryPolicy{Attempts: 3, Backoff: time.Second}, ""},
		{"a.b", RetryPolicy{Attempts: 1, Backoff: 10 * time.Millisecond, MaxBackoff: time.Hour}, ""},
		{"a b", RetryPolicy{Attempts: 3, Backoff: time.Second}, "stage"},
		{"x", RetryPolicy{Attempts: 0, Backoff: time.Second}, "attempts 0"},
		{"x", RetryPolicy{Attempts: 1001, Backoff: time.Second}, "attempts 1001"},
		{"x", RetryPolicy{Attempts: 3}, "backoff 0s"},
		{"x", RetryPolicy{Attempts: 3, Backoff: 8 * 24 * time.Hour}, "backoff 192h"},
		{"x", RetryPolicy{Attempts: 3, Backoff: time.Second, MaxBackoff: time.Millisecond * 500}, "max backoff"},
	}
	for _, tt := range tests {
		err := CheckRetry(tt.stage, tt.p)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s %+v: got %v, want valid", tt.stage, tt.p, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s %+v: got %v, want an error saying %q", tt.stage, tt.p, err, tt.want)
		}
	}
}

func TestHandlerFailure(t *testing.T) {
	h := func(kv ...string) nats.Header {
		out := nats.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	tests := []struct {
		name      string
		h         nats.Header
		failed    bool
		permanent bool
	}{
		{"result", h(), false, false},
		{"result with headers", h("Content-Type", "text/plain"), false, false},
		{"transient", h(codec.HeaderServiceError, "busy", codec.HeaderServiceErrorCode, "503"), true, false},
		{"error without a code", h(codec.HeaderServiceError, "busy"), true, false},
		{"permanent", h(codec.HeaderServiceError, "no such item", codec.HeaderServiceErrorCode, "422"), true, true},
		{"permanent without text", h(codec.HeaderServiceErrorCode, "422"), true, true},
		{"a code alone is no error", h(codec.HeaderServiceErrorCode, "500"), false, false},
	}
	for _, tt := range tests {
		err := handlerFailure(tt.h, "s", "n")
		if (err != nil) != tt.failed || isPermanent(err) != tt.permanent {
			t.Errorf("%s: got %v (permanent %v), want failed %v permanent %v", tt.name, err, isPermanent(err), tt.failed, tt.permanent)
		}
	}
	if err := handlerFailure(h(codec.HeaderServiceError, "x", codec.HeaderServiceErrorCode, "422"), "s", "n"); !isPermanent(errors.Join(errors.New("wrapped"), err)) {
		t.Error("a wrapped permanent failure is not seen as permanent")
	}
}

// A command's node headers: a retry copy's attempts count on, bad values
// are refused, and they never come from inside the seal.
func TestCommandNodeHeaders(t *testing.T) {
	d := codec.Delivery{Type: codec.TypeCommand, RoutingKey: "cmd.s", MessageId: "m1", Headers: amqp.Table{
		codec.HeaderOrigin: "beta", codec.HeaderAttempts: "2", codec.HeaderFirstOrigin: "alpha", codec.HeaderResultTopic: "jobs.done",
		codec.HeaderFirstFail: "2026-01-02T03:04:05.000Z", codec.HeaderReplayed: "r",
	}}
	e, err := codec.Decode(codec.TypeCommand, d, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if e.Attempt != 3 || e.Retry.FirstOrigin != "alpha" || e.ResultTopic != "jobs.done" || e.Retry.FirstFail == "" || e.Retry.Replayed != "r" {
		t.Errorf("decoded: attempt %d first origin %q topic %q first failure %q replayed %q", e.Attempt, e.Retry.FirstOrigin, e.ResultTopic, e.Retry.FirstFail, e.Retry.Replayed)
	}
	m := e.CommandMsg("s", false)
	if m.Header.Get(codec.HeaderAttempt) != "3" || m.Header.Get(codec.HeaderFirstOrigin) != "alpha" || m.Header.Get(codec.HeaderResultTopic) != "jobs.done" ||
		m.Header.Get(codec.HeaderRedelivered) != "true" {
		t.Errorf("handler headers: got %v", m.Header)
	}
	for k, v := range map[string]string{codec.HeaderAttempts: "-1", codec.HeaderFirstOrigin: "a.b", codec.HeaderResultTopic: "a..b"} {
		bad := codec.Delivery{Type: codec.TypeCommand, RoutingKey: "cmd.s", MessageId: "m1", Headers: amqp.Table{codec.HeaderOrigin: "beta", k: v}}
		if _, err := codec.Decode(codec.TypeCommand, bad, 1<<20); err == nil {
			t.Errorf("%s: %q: got no error", k, v)
		}
	}
}

func TestSplitNodeHeaders(t *testing.T) {
	h := nats.Header{"X-A": {"1"}, codec.HeaderResultTopic: {"t"}}
	out, meta := codec.SplitNodeHeaders(h, nil)
	if out.Get(codec.HeaderResultTopic) != "" || out.Get("X-A") != "1" || meta[codec.HeaderResultTopic] != "t" {
		t.Errorf("split: got %v %v", out, meta)
	}
	if h.Get(codec.HeaderResultTopic) != "t" {
		t.Error("the record's headers were changed")
	}
	plain := nats.Header{"X-A": {"1"}}
	if out, meta := codec.SplitNodeHeaders(plain, nil); len(out) != 1 || meta != nil {
		t.Errorf("nothing to split: got %v %v", out, meta)
	}
}

// A command's result topic is sealed with it: the broker does not see it,
// and one added or changed outside the seal is not taken.
func TestResultTopicSealed(t *testing.T) {
	b, ring := sealTestBridge(t)
	out := &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: codec.CommandKey("render"), Kind: codec.TypeCommand, MsgID: "m1", At: time.Now(),
		Header: nats.Header{"X-A": {"1"}}, Meta: map[string]string{codec.HeaderResultTopic: "jobs.done"}, Body: []byte("x")}
	p, err := out.Publishing("alpha", "guest", ring)
	if err != nil {
		t.Fatal(err)
	}
	if p.Headers[codec.HeaderResultTopic] != nil {
		t.Errorf("the result topic is readable outside the seal: %v", p.Headers)
	}
	if out.Header.Get(codec.HeaderResultTopic) != "" {
		t.Error("sealing changed the record's headers")
	}
	env, err := b.open(codec.TypeCommand, deliver(p, out.Key))
	if err != nil {
		t.Fatal(err)
	}
	if env.ResultTopic != "jobs.done" || env.Header.Get(codec.HeaderResultTopic) != "" || env.Header.Get("X-A") != "1" {
		t.Errorf("opened: topic %q headers %v", env.ResultTopic, env.Header)
	}
	// Redirected outside the seal: not taken.
	p.Headers[codec.HeaderResultTopic] = "elsewhere"
	env, err = b.open(codec.TypeCommand, deliver(p, out.Key))
	if err != nil {
		t.Fatal(err)
	}
	if env.ResultTopic != "jobs.done" {
		t.Errorf("a result topic set outside the seal was taken: %q", env.ResultTopic)
	}
	out.Meta = nil
	p, err = out.Publishing("alpha", "guest", ring)
	if err != nil {
		t.Fatal(err)
	}
	p.Headers[codec.HeaderResultTopic] = "elsewhere"
	if env, err = b.open(codec.TypeCommand, deliver(p, out.Key)); err != nil || env.ResultTopic != "" {
		t.Errorf("a result topic added outside the seal: got %q, %v", env.ResultTopic, err)
	}
}
