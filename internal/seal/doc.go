// Package seal holds meshbox's cryptography: each node's key pair, the
// mesh's content keys, and the sealing of messages with them. It uses the
// standard library only (crypto/hpke, crypto/aes, crypto/cipher,
// crypto/rand) and invents no construction.
//
// # Node keys
//
// A node's key pair (NodeKey) is an HPKE (RFC 9180) key pair of the hybrid
// post-quantum KEM ML-KEM-768 + X25519 (crypto/hpke.MLKEM768X25519, "X-Wing"),
// with HKDF-SHA256 and AES-256-GCM. The private half is a 32-byte seed kept
// in the node's data directory (mode 0600, see LoadOrCreateNodeKey); the
// public half (1,216 bytes) is in the node's record in the mesh database.
// Anything sealed to a node (SealTo: content keys, grant credentials) can be
// opened only with its private half. The info string of each seal names what
// is sealed and for whom (ContentKeyInfo, GrantInfo), so a sealed copy moved
// to another key id, node or grant does not open. The hybrid KEM costs about
// half a millisecond for a seal and its open (BenchmarkSealTo), and it is
// used only when a key or a credential is handed out, never per message.
//
// # Content keys
//
// A content key (ContentKey) is 32 random bytes with an id; messages are
// sealed with AES-256-GCM under it, a random 96-bit nonce per message
// (cipher.NewGCMWithRandomNonce). A Keyring holds the content keys a node
// has, by id, and the id it seals with now; it is safe for concurrent use
// and swapped as a whole when the keys change, so the hot path takes no
// lock. Random nonces bound a key to about 2^32 messages; rotate keys
// (meshbox mesh key rotate) well before that.
//
// # Key commitments
//
// The node that makes a content key's bytes publishes, with its claim of
// the key's id, the key's commitment (ContentKey.Commitment: SHA-256 over
// a label, the id and the bytes); the mesh database keeps it unchanged
// while any node holds the key. A node checks every copy it opens against
// it (CheckCommitment) and uses no key that does not match: so any holder
// may seal a key for a node that lacks it, and a malicious holder can hand
// it the key or nothing, never bytes of its own choosing. Copies are not
// signed besides: the attacker is a holder, whose signature a receiver
// would accept; the commitment refuses its bogus copy whoever signed it.
// The database's admin, who could rewrite a commitment, could as well
// rewrite the signing keys a signature would be checked with.
//
// # Scopes
//
// A scope is a smaller trust boundary inside a mesh: content keys of its
// own (ContentKey.Scope), held only by the scope's members, and names
// (capabilities, stages, event topics) bound to it. The one keyring holds
// the keys of every scope the node is in, each tagged with its scope, and
// what it needs to know of scopes (SetScoped, Scopes): ScopeOf says which
// scope a name is bound to, SealerFor gives that scope's key to seal with
// (ErrNotMember outside it), KeyScope says which scope a key id belongs
// to, so that a receiver refuses a message of a scoped name sealed with
// any other key.
//
// # Sealed messages
//
// Sealer.Seal (the keyring's current key) returns nonce || ciphertext ||
// tag; Keyring.Open takes the key id and the same associated data. The associated data is the caller's:
// the bridge binds each message's routing metadata and validated origin to
// it (AssociatedData builds the canonical encoding).
package seal
