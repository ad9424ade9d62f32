package bridge

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/meshbox/meshbox/internal/seal"
)

// This file keeps a program's words out of the node's plain headers.
//
// A command's failures travel with it in node headers the broker reads:
// Meshbox-Last-Reason on a retry copy, Meshbox-Dead-Reason on a dead
// letter, Meshbox-Replayed on a replay. A handler's failure is its own
// text (the Nats-Service-Error of its reply), which may say anything the
// program knows. So each failure has two forms: its class, the node's own
// short words with none of the program's ("handler replied error 500",
// "permanent failure at attempt 1: handler replied error 422"), and its
// full text. In a mesh that seals (Config.Keys), the header holds the
// class, readable to the broker's operator, and, when the full text says
// more, the companion header <name>-Sealed holds it sealed:
//
//	Meshbox-Dead-Reason-Sealed: <key id>:<base64 of nonce || AES-256-GCM(text) || tag>
//
// under the key the command's stage is sealed with (the mesh's, or its
// scope's), with associated data binding it to what it belongs to: the
// header's name, the class beside it, the command's routing key
// (cmd.<stage>), its message id, the key id and the key's scope. A sealed
// reason moved to another header, message or stage, or whose class was
// changed, does not open. The nodes hosting the stage open it (meshbox
// dlq list and show, a replay, the Meshbox-Replayed a handler sees); one
// that does not open is shown as its class followed by "(sealed reason:
// cannot open: why)", never an error that hides the dead letter. Without
// keys (standalone, or a mesh run with --broker and no database) the
// header holds the full text, as before.

// The sealed companions of the reason headers.
const (
	HeaderDeadReasonSealed = HeaderDeadReason + sealedReasonSuffix
	HeaderLastReasonSealed = HeaderLastReason + sealedReasonSuffix
	HeaderReplayedSealed   = HeaderReplayed + sealedReasonSuffix

	sealedReasonSuffix = "-Sealed"
	reasonADLabel      = "meshbox reason v1"
)

// classed is a failure whose text may hold a program's words: its class
// says what happened in the node's own.
type classed interface {
	error
	class() string
}

// failureClass is the class of err: the node's own words. An error that
// is not classed holds none of a program's words: its text is its class.
func failureClass(err error) string {
	var c classed
	if errors.As(err, &c) {
		return c.class()
	}
	return err.Error()
}

// deadReason is a dead-letter reason that is not a decoding error: its
// full text and its class.
type deadReason struct{ text, cls string }

func (r *deadReason) Error() string { return r.text }
func (r *deadReason) class() string { return r.cls }

// reasonf is the dead-letter reason prefix followed by failure.
func reasonf(prefix string, failure error) *deadReason {
	return &deadReason{text: prefix + failure.Error(), cls: prefix + failureClass(failure)}
}

// plainReason is a dead-letter reason in the node's own words only.
func plainReason(text string) *deadReason { return &deadReason{text: text, cls: text} }

// handlerError is a handler's error reply: its code and its own text.
type handlerError struct {
	stage, node, code, text string
}

func (e *handlerError) Error() string {
	return fmt.Sprintf("handler of stage %s on node %s replied error %s %s", e.stage, e.node, e.code, e.text)
}

// class names the code only when it is one (the program sets it too).
func (e *handlerError) class() string {
	if len(e.code) == 3 && strings.Trim(e.code, "0123456789") == "" {
		return fmt.Sprintf("handler of stage %s on node %s replied error %s", e.stage, e.node, e.code)
	}
	return fmt.Sprintf("handler of stage %s on node %s replied an error", e.stage, e.node)
}

// class of a refused sealed message: a malformed one's detail may quote
// what was inside the seal.
func (e *unsealError) class() string {
	if e.reason == unsealMalformed {
		return "sealed message refused (" + e.reason + ")"
	}
	return e.Error()
}

// reasonAD is the associated data of a sealed reason (see above).
func reasonAD(name, class, rkey, msgID, keyID, scope string) []byte {
	if scope == "" {
		return seal.AssociatedData(nil, reasonADLabel, name, class, rkey, msgID, keyID)
	}
	return seal.AssociatedData(nil, reasonADLabel, name, class, rkey, msgID, keyID, scope)
}

// reasonHeaders returns the values of reason header name of message msgID
// routed with rkey (cmd.<stage>), of the given kind: without keys, the
// text (plain ""); with keys, the class, and the text sealed when it says
// more than the class. When there is no key to seal with, the text is
// left out: only the class goes.
func (b *Bridge) reasonHeaders(name, kind, rkey, msgID, text, class string) (plain, sealed string) {
	text, class = clip(text, maxReason), clip(class, maxReason)
	keys := b.cfg.Keys
	if keys == nil {
		return text, ""
	}
	if text == class {
		return class, ""
	}
	sl, err := keys.SealerFor(outgoingScope(keys, kind, rkey))
	if err != nil {
		return class, ""
	}
	ct := sl.Seal(nil, reasonAD(name, class, rkey, msgID, sl.ID(), sl.Scope()), []byte(text))
	return class, sl.ID() + ":" + base64.RawStdEncoding.EncodeToString(ct)
}

// openReason returns the text of reason header name of message msgID
// routed with rkey, whose plain value is class and sealed companion
// sealed: class when nothing is sealed, the opened text, or class with
// why it does not open.
func (b *Bridge) openReason(name, rkey, msgID, class, sealed string) string {
	if sealed == "" {
		return class
	}
	text, err := b.openSealedReason(name, rkey, msgID, class, sealed)
	if err != nil {
		return strings.TrimSpace(class + " (sealed reason: cannot open: " + err.Error() + ")")
	}
	return text
}

func (b *Bridge) openSealedReason(name, rkey, msgID, class, sealed string) (string, error) {
	keyID, b64, ok := strings.Cut(sealed, ":")
	if !ok || seal.ValidateKeyID(keyID) != nil {
		return "", errors.New("not a sealed reason")
	}
	ct, err := base64.RawStdEncoding.DecodeString(b64)
	if err != nil {
		return "", errors.New("not a sealed reason")
	}
	keys := b.cfg.Keys
	if keys == nil {
		return "", fmt.Errorf("node %s holds no keys", b.cfg.Node)
	}
	scope, _ := keys.KeyScope(keyID)
	pt, err := keys.Open(nil, keyID, reasonAD(name, class, rkey, msgID, keyID, scope), ct)
	switch {
	case errors.Is(err, seal.ErrUnknownKey):
		return "", fmt.Errorf("sealed with key %s, which node %s does not hold (retired, or never received)", keyID, b.cfg.Node)
	case err != nil:
		return "", fmt.Errorf("does not open with key %s: changed, or moved to another message", keyID)
	}
	return string(pt), nil
}

// joinReason is the stored form of an outbox dead letter's reason (record
// reason): the class, then a NUL and the text when it says more. A
// record stored before classes existed reads as a class alone.
func joinReason(r error) string {
	text, class := r.Error(), failureClass(r)
	if text == class {
		return text
	}
	return class + "\x00" + text
}

// splitReason reads joinReason's form.
func splitReason(s string) (class, text string) {
	if c, t, ok := strings.Cut(s, "\x00"); ok {
		return c, t
	}
	return s, s
}
