package backup

import (
	"os"
	"testing"
)

// TestMain makes a passphrase cheap to derive (the archive records the
// cost it was sealed with, so restoring reads it from there): Argon2id at
// its real cost takes seconds under the race detector.
func TestMain(m *testing.M) {
	argonTime, argonMemory = 1, 64
	os.Exit(m.Run())
}
