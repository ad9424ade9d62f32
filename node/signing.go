package node

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"maps"
)

// Signed discovery (protocol version 4): every message a node sends is
// signed with its signing key, and a receiver verifies it with the
// sender's public signing key from the bindings' node records (see
// "Signed discovery" in doc.go).

// SigningProtocolVersion is the first version whose nodes sign what they
// say: a message of theirs carries "sig".
const SigningProtocolVersion = 4

// signingContext starts what a discovery signature covers, so that a
// signature made for anything else never verifies as one.
const signingContext = "meshbox discovery v4\x00"

// maxSigLen bounds the "sig" field: an Ed25519 signature in unpadded
// base64url is 86 characters.
const maxSigLen = 128

// Signer signs discovery messages with the node's signing key. Sign must
// be safe for concurrent use.
type Signer interface {
	Sign(message []byte) []byte
}

// Reasons a signed-discovery check refuses a message, as labels of
// meshbox_discovery_rejected_total.
const (
	reasonUnsigned = "unsigned" // the sender's record has a signing key; the message is not signed
	reasonForged   = "forged"   // the signature does not verify with the sender's signing key
	reasonReplayed = "replayed" // a signed message whose sequence number this node saw from that run already
)

// signBody returns body (an encoded Message without "sig") with the
// signature of s appended as its last member, "sig".
func signBody(body []byte, s Signer) []byte {
	sig := base64.RawURLEncoding.EncodeToString(s.Sign(signingInput(body)))
	out := make([]byte, 0, len(body)+len(sig)+9)
	out = append(out, body[:len(body)-1]...)
	out = append(out, `,"sig":"`...)
	out = append(out, sig...)
	return append(out, `"}`...)
}

// signingInput is what the signature of a message body covers: the
// context, then every byte of the body but "sig" (so its kind, sender,
// addressee, peer, run and sequence number and all it carries).
func signingInput(unsigned []byte) []byte {
	return append([]byte(signingContext), unsigned...)
}

// verifyBody reports whether body, whose decoded "sig" is sig, is signed
// by pub: "sig" must be its last member, as signBody writes it.
func verifyBody(body []byte, sig string, pub ed25519.PublicKey) bool {
	suffix := `,"sig":"` + sig + `"}`
	if sig == "" || !bytes.HasSuffix(body, []byte(suffix)) {
		return false
	}
	raw, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return false
	}
	unsigned := append(body[:len(body)-len(suffix):len(body)-len(suffix)], '}')
	return ed25519.Verify(pub, signingInput(unsigned), raw)
}

// checkSignature applies the version rule to m, received as body: a
// sender whose record has a signing key (keys) must have signed it with
// that key; a sender without one (a node of an older version, or one
// that has not published its key yet) is taken on the broker's word, as
// before. It returns the reason of a refusal ("" when accepted) and
// whether the signature was verified.
func checkSignature(keys map[string]ed25519.PublicKey, m *Message, body []byte) (reason string, verified bool) {
	pub, ok := keys[m.Node]
	switch {
	case !ok:
		return "", false
	case m.Sig == "":
		return reasonUnsigned, false
	case !verifyBody(body, m.Sig, pub):
		return reasonForged, false
	}
	return "", true
}

// SetSigningKeys replaces the signing keys of the mesh's nodes (node ->
// Ed25519 public key), from the bindings' node records. From then on a
// message from a node in keys is accepted only when it is signed with its
// key; a node not in keys has not published one. Keys of the wrong size
// are kept: they verify nothing, so that node's messages are refused.
func (n *Node) SetSigningKeys(keys map[string]ed25519.PublicKey) {
	k := maps.Clone(keys)
	if k == nil {
		k = map[string]ed25519.PublicKey{}
	}
	n.keys.Store(&k)
}

// signingKeys returns the keys SetSigningKeys set last (none before).
func (n *Node) signingKeys() map[string]ed25519.PublicKey {
	if k := n.keys.Load(); k != nil {
		return *k
	}
	return nil
}

// refusedLocked counts a message from sender refused for reason and logs
// it once per reason and sender.
func (n *Node) refusedLocked(reason, sender, typ string) {
	n.m.rejected.WithLabelValues(reason).Inc()
	key := reason + "\x00" + sender
	if n.refusedLogged[key] || len(n.refusedLogged) >= maxRefusedLogged {
		return
	}
	n.refusedLogged[key] = true
	msg := map[string]string{
		reasonUnsigned: "discovery message refused: not signed, and the sender's node record has a signing key",
		reasonForged:   "discovery message refused: its signature does not verify with the sender's signing key",
		reasonReplayed: "discovery message refused: a signed message seen already (replayed)",
	}[reason]
	n.logger.Warn(msg, "sender", sender, "type", typ, "reason", reason)
}

// maxRefusedLogged bounds the (reason, sender) pairs logged once.
const maxRefusedLogged = 1024
