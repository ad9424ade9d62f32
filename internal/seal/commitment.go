package seal

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
)

// CommitmentSize is the size of a content key's commitment: a SHA-256.
const CommitmentSize = sha256.Size

// commitmentLabel starts what a commitment hashes (AssociatedData
// encoding: the label, the key id, the key's bytes).
const commitmentLabel = "meshbox content key commitment v1"

// Commitment returns the key's commitment: SHA-256 over a label, the key
// id and the key's bytes, each length-prefixed. The node that makes a
// key's bytes publishes it with its claim; every node that opens a sealed
// copy of the key checks the copy against it (CheckCommitment). It reveals
// nothing of the key (32 random bytes) and binds the id to the bytes: no
// other bytes, and no other key id, give the same commitment.
func (k ContentKey) Commitment() []byte {
	sum := sha256.Sum256(AssociatedData(nil, commitmentLabel, k.ID, string(k.key[:])))
	return sum[:]
}

// CheckCommitment returns nil when commitment is k's, and an error
// wrapping ErrCommitment otherwise.
func (k ContentKey) CheckCommitment(commitment []byte) error {
	if len(commitment) != CommitmentSize || subtle.ConstantTimeCompare(k.Commitment(), commitment) != 1 {
		return fmt.Errorf("%w: content key %s", ErrCommitment, k.ID)
	}
	return nil
}
