package backup

import "errors"

// Errors of Open (reading an archive without its key).
var (
	// ErrDamaged: the archive is not a complete meshbox backup, or an
	// entry does not match the checksum its manifest records.
	ErrDamaged = errors.New("backup archive damaged")
	// ErrNewerFormat: the archive was written by a newer meshbox.
	ErrNewerFormat = errors.New("backup archive of a newer format")
)

// Errors of Archive.Unseal.
var (
	// ErrWrongKey: the kit or passphrase does not open the archive's data
	// key (another kit or passphrase, or a manifest altered).
	ErrWrongKey = errors.New("backup archive does not open with this key")
	// ErrOtherMesh: the kit is the kit of another mesh than the archive's.
	ErrOtherMesh = errors.New("backup archive of another mesh")
)

// Errors of Writer and of restoring.
var (
	// ErrExists: the destination exists (an archive is never written over
	// a file; a restore never into a directory that holds files).
	ErrExists = errors.New("exists")
	// ErrPassphrase: a passphrase too short to seal with.
	ErrPassphrase = errors.New("passphrase too short")
)
