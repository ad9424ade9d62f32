package blobs

import (
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/meshbox/meshbox/internal/names"
)

// refPrefix starts every blob reference.
const refPrefix = "blob:"

// Ref names one blob in the mesh: the node that holds it and its SHA-256.
// Its text form is blob:<node>/<sha256 in lowercase hex>.
type Ref struct {
	Node   string
	SHA256 string
}

// String is the reference's text form.
func (r Ref) String() string { return refPrefix + r.Node + "/" + r.SHA256 }

// ParseRef reads a reference in its text form.
func ParseRef(s string) (Ref, error) {
	rest, ok := strings.CutPrefix(s, refPrefix)
	if !ok {
		return Ref{}, fmt.Errorf("%w: %q does not start with %s", ErrBadRef, s, refPrefix)
	}
	node, sum, ok := strings.Cut(rest, "/")
	if !ok {
		return Ref{}, fmt.Errorf("%w: %q is not blob:<node>/<sha256>", ErrBadRef, s)
	}
	if err := names.Node(node); err != nil {
		return Ref{}, fmt.Errorf("%w: %q: %w", ErrBadRef, s, err)
	}
	if err := CheckSHA256(sum); err != nil {
		return Ref{}, fmt.Errorf("%w: %q: %w", ErrBadRef, s, err)
	}
	return Ref{Node: node, SHA256: sum}, nil
}

// CheckSHA256 checks that s is a SHA-256 in lowercase hex (64 digits).
func CheckSHA256(s string) error {
	if len(s) != 64 {
		return fmt.Errorf("sha256 %q: want 64 hex digits, got %d characters", s, len(s))
	}
	if strings.ToLower(s) != s {
		return fmt.Errorf("sha256 %q: want lowercase hex", s)
	}
	if _, err := hex.DecodeString(s); err != nil {
		return fmt.Errorf("sha256 %q: not hex", s)
	}
	return nil
}
