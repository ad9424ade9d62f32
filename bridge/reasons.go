package bridge

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/meshbox/meshbox/bridge/codec"

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
	sl, err := keys.SealerFor(codec.OutgoingScope(keys, kind, rkey))
	if err != nil {
		return class, ""
	}
	ct := sl.Seal(nil, codec.ReasonAD(name, class, rkey, msgID, sl.ID(), sl.Scope()), []byte(text))
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
	pt, err := keys.Open(nil, keyID, codec.ReasonAD(name, class, rkey, msgID, keyID, scope), ct)
	switch {
	case errors.Is(err, seal.ErrUnknownKey):
		return "", fmt.Errorf("sealed with key %s, which node %s does not hold (retired, or never received)", keyID, b.cfg.Node)
	case err != nil:
		return "", fmt.Errorf("does not open with key %s: changed, or moved to another message", keyID)
	}
	return string(pt), nil
}
