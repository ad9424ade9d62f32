package seal

import "errors"

// Errors of Keyring.Open and Keyring.Seal.
var (
	// ErrUnknownKey means the message names a key id this node does not
	// hold (never received, or retired).
	ErrUnknownKey = errors.New("unknown key id")
	// ErrTampered means the message does not open under its key: its
	// ciphertext or its associated data was changed, or it was sealed for
	// another route or origin.
	ErrTampered = errors.New("message does not open (tampered or moved)")
	// ErrNoKey means the keyring holds no key to seal with.
	ErrNoKey = errors.New("no content key to seal with")
	// ErrNotMember means this node is not in the scope it would seal for:
	// it holds none of the scope's keys and never will.
	ErrNotMember = errors.New("this node is not in the scope")
)

// Errors of node keys and sealed keys.
var (
	// ErrBadKey means a key's stored or published form is not valid.
	ErrBadKey = errors.New("invalid key")
	// ErrSealedOpen means a value sealed to this node does not open: it was
	// sealed to another key, for another purpose, or changed.
	ErrSealedOpen = errors.New("sealed value does not open with this node's key")
	// ErrCommitment means an opened content key is not the one its
	// commitment names: whoever sealed the copy handed over other bytes.
	ErrCommitment = errors.New("content key does not match its commitment")
)
