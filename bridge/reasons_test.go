package bridge

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/bridge/outbox"
	"github.com/meshbox/meshbox/internal/seal"
)

const reasonMarker = "customer-4711-has-no-credit"

// A handler's failure has a class without the handler's words, in every
// reason the node builds from it.
func TestFailureClassHoldsNoProgramText(t *testing.T) {
	h := func(code string) nats.Header {
		return nats.Header{codec.HeaderServiceError: {reasonMarker}, codec.HeaderServiceErrorCode: {code}}
	}
	for _, tt := range []struct {
		name, code, class string
	}{
		{"transient", "500", "handler of stage s on node n replied error 500"},
		{"permanent", strconv.Itoa(codec.CodePermanent), "handler of stage s on node n replied error 422"},
		{"a code that is not one", "5" + reasonMarker, "handler of stage s on node n replied an error"},
	} {
		failure := handlerFailure(h(tt.code), "s", "n")
		if !strings.Contains(failure.Error(), reasonMarker) {
			t.Errorf("%s: text %q, want the handler's words", tt.name, failure.Error())
		}
		if got := codec.FailureClass(failure); got != tt.class {
			t.Errorf("%s: class %q, want %q", tt.name, got, tt.class)
		}
		r := codec.Reasonf("attempt 3 of 3 failed: ", failure)
		if strings.Contains(codec.FailureClass(r), reasonMarker) || !strings.HasPrefix(codec.FailureClass(r), "attempt 3 of 3 failed: handler") {
			t.Errorf("%s: dead-letter class %q, want the prefix and the class", tt.name, codec.FailureClass(r))
		}
		if !strings.Contains(r.Error(), reasonMarker) {
			t.Errorf("%s: dead-letter text %q, want the handler's words", tt.name, r.Error())
		}
	}
	malformed := &codec.UnsealError{Reason: codec.UnsealMalformed, Detail: "header key \"" + reasonMarker + "\" is not allowed"}
	if c := codec.FailureClass(malformed); strings.Contains(c, reasonMarker) || c != "sealed message refused (malformed)" {
		t.Errorf("malformed sealed message: class %q", c)
	}
	tampered := &codec.UnsealError{Reason: codec.UnsealTampered, Detail: "does not open with key k1"}
	if codec.FailureClass(tampered) != tampered.Error() {
		t.Errorf("tampered: class %q, want its text %q (the node's own words)", codec.FailureClass(tampered), tampered.Error())
	}
	if c := codec.FailureClass(errors.New("no handler")); c != "no handler" {
		t.Errorf("an unclassed error: class %q, want its text", c)
	}
}

// A sealed reason opens where it was sealed, and only there: moved to
// another message, stage or header, or with its class changed, or under a
// key the node does not hold, it is shown as its class and why it does
// not open, never its text.
func TestSealedReasonBoundToItsMessage(t *testing.T) {
	b, _ := sealTestBridge(t)
	text := "attempt 1 of 1 failed: handler replied error 500 " + reasonMarker
	class := "attempt 1 of 1 failed: handler replied error 500"
	plain, sealed := b.reasonHeaders(codec.HeaderDeadReason, codec.TypeCommand, "cmd.vault", "m1", text, class)
	if plain != class || sealed == "" || strings.Contains(sealed, reasonMarker) {
		t.Fatalf("headers: plain %q sealed %q; want the class and the text sealed", plain, sealed)
	}
	if !strings.HasPrefix(sealed, b.cfg.Keys.Current()+":") {
		t.Errorf("sealed %q, want it to start with the key id", sealed)
	}
	if got := b.openReason(codec.HeaderDeadReason, "cmd.vault", "m1", plain, sealed); got != text {
		t.Fatalf("opened: got %q, want %q", got, text)
	}
	refused := func(what, got string) {
		t.Helper()
		if strings.Contains(got, reasonMarker) || !strings.Contains(got, "(sealed reason: cannot open: ") {
			t.Errorf("%s: got %q, want it refused", what, got)
		}
	}
	refused("another message id", b.openReason(codec.HeaderDeadReason, "cmd.vault", "m2", plain, sealed))
	refused("another stage", b.openReason(codec.HeaderDeadReason, "cmd.ledger", "m1", plain, sealed))
	refused("another header", b.openReason(codec.HeaderLastReason, "cmd.vault", "m1", plain, sealed))
	refused("another class", b.openReason(codec.HeaderDeadReason, "cmd.vault", "m1", "lease expired", sealed))
	flipped := []byte(sealed)
	flipped[len(flipped)-3] ^= 1
	refused("a changed byte", b.openReason(codec.HeaderDeadReason, "cmd.vault", "m1", plain, string(flipped)))
	refused("not a sealed reason", b.openReason(codec.HeaderDeadReason, "cmd.vault", "m1", plain, "junk"))

	other, _ := sealTestBridge(t) // holds another key: the one sealed with is retired there
	got := other.openReason(codec.HeaderDeadReason, "cmd.vault", "m1", plain, sealed)
	refused("a key not held", got)
	if !strings.HasPrefix(got, class+" (sealed reason: cannot open: sealed with key ") {
		t.Errorf("a key not held: got %q, want the class and which key", got)
	}

	// The node's own words alone are not sealed; without keys the text is
	// plain, as before.
	if p, s := b.reasonHeaders(codec.HeaderDeadReason, codec.TypeCommand, "cmd.vault", "m1", "lease expired", "lease expired"); p != "lease expired" || s != "" {
		t.Errorf("a reason without a program's words: got %q %q", p, s)
	}
	standalone := &Bridge{cfg: Config{Node: "beta"}}
	if p, s := standalone.reasonHeaders(codec.HeaderDeadReason, codec.TypeCommand, "cmd.vault", "m1", text, class); p != text || s != "" {
		t.Errorf("standalone: got %q %q, want the text plain", p, s)
	}
	// Keys with none to seal with: only the class goes.
	ring, err := seal.NewKeyring(nil, "")
	if err != nil {
		t.Fatal(err)
	}
	nokey := &Bridge{cfg: Config{Node: "beta", Keys: ring}}
	if p, s := nokey.reasonHeaders(codec.HeaderDeadReason, codec.TypeCommand, "cmd.vault", "m1", text, class); p != class || s != "" {
		t.Errorf("no key to seal with: got %q %q, want the class alone", p, s)
	}
}

// A scoped stage's reason is sealed with the scope's key and opens only
// in the scope.
func TestSealedReasonOfAScope(t *testing.T) {
	km, kv := seal.NewContentKey(), seal.NewContentKey()
	kv.Scope = "vault"
	member := scopeTestBridge(scopeRing(t, km, kv, true, true))
	outside := scopeTestBridge(scopeRing(t, km, kv, false, true))
	plain, sealed := member.reasonHeaders(codec.HeaderDeadReason, codec.TypeCommand, "cmd.ledger", "m1", "x "+reasonMarker, "x")
	if !strings.HasPrefix(sealed, kv.ID+":") {
		t.Fatalf("sealed %q, want the scope's key %s", sealed, kv.ID)
	}
	if got := member.openReason(codec.HeaderDeadReason, "cmd.ledger", "m1", plain, sealed); got != "x "+reasonMarker {
		t.Errorf("in the scope: got %q", got)
	}
	if got := outside.openReason(codec.HeaderDeadReason, "cmd.ledger", "m1", plain, sealed); strings.Contains(got, reasonMarker) {
		t.Errorf("outside the scope: got %q", got)
	}
}

// An outbox dead letter's reason keeps its class and text; a record
// stored before classes reads as its text.
func TestJoinReason(t *testing.T) {
	r := codec.Reasonf("permanent failure at attempt 1: ", handlerFailure(nats.Header{codec.HeaderServiceError: {reasonMarker},
		codec.HeaderServiceErrorCode: {"422"}}, "s", "n"))
	class, text := codec.SplitReason(codec.JoinReason(r))
	if class != codec.FailureClass(r) || text != r.Error() {
		t.Errorf("split: got %q %q", class, text)
	}
	if c, tx := codec.SplitReason(codec.JoinReason(codec.PlainReason("no route"))); c != "no route" || tx != "no route" {
		t.Errorf("plain: got %q %q", c, tx)
	}
	if c, tx := codec.SplitReason("old reason"); c != "old reason" || tx != "old reason" {
		t.Errorf("old record: got %q %q", c, tx)
	}
}

// A dead letter the outbox keeps (a local command's failure while the
// link was down) goes to the broker with the class, its text sealed.
func TestOutboxDeadLetterReasonSealed(t *testing.T) {
	b, ring := sealTestBridge(t)
	failure := handlerFailure(nats.Header{codec.HeaderServiceError: {reasonMarker}, codec.HeaderServiceErrorCode: {"500"}}, "vault", "beta")
	reason := codec.Reasonf("attempt 5 of 5 failed: ", failure)
	rec := &outbox.Record{Kind: outbox.Dead, Name: "vault", MsgID: "m1", Reason: codec.JoinReason(reason), Body: []byte("x")}
	p, err := b.outgoingFor(rec, false).Publishing("beta", "", ring)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := p.Headers[codec.HeaderDeadReason].(string)
	sealed, _ := p.Headers[codec.HeaderDeadReasonSealed].(string)
	if plain != codec.FailureClass(reason) || sealed == "" {
		t.Fatalf("headers: got %v, want the class and the text sealed", p.Headers)
	}
	for k, v := range p.Headers {
		if s, _ := v.(string); strings.Contains(s, reasonMarker) {
			t.Errorf("header %s holds the handler's words: %q", k, s)
		}
	}
	if got := b.openReason(codec.HeaderDeadReason, "cmd.vault", "m1", plain, sealed); got != reason.Error() {
		t.Errorf("opened: got %q, want %q", got, reason.Error())
	}
}
