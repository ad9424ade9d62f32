package seal

import (
	"errors"
	"testing"
)

func TestCommitmentBindsIDAndBytes(t *testing.T) {
	k, err := ContentKeyFrom("k1", NewContentKey().Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if err := k.CheckCommitment(k.Commitment()); err != nil {
		t.Fatalf("a key against its own commitment: %v", err)
	}
	sameBytes, _ := ContentKeyFrom("k2", k.Bytes())
	otherBytes, _ := ContentKeyFrom("k1", NewContentKey().Bytes())
	for _, c := range []struct {
		name       string
		commitment []byte
	}{
		{"another id, the same bytes", sameBytes.Commitment()},
		{"the same id, other bytes", otherBytes.Commitment()},
		{"none", nil},
		{"too short", k.Commitment()[:16]},
	} {
		if err := k.CheckCommitment(c.commitment); !errors.Is(err, ErrCommitment) {
			t.Errorf("%s: got %v, want ErrCommitment", c.name, err)
		}
	}
	if len(k.Commitment()) != CommitmentSize {
		t.Errorf("commitment size: got %d, want %d", len(k.Commitment()), CommitmentSize)
	}
}
