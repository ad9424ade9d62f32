package codec

import (
	"errors"
)

// Forged is a delivery whose origin cannot be trusted: it is dropped (dead-
// lettered with the reason) and counted as errKindForged. cause is one of
// the cause* constants (senders.go); "" is causeOther.
type Forged struct {
	Cause  string
	Reason string
}

func (e *Forged) Error() string { return "forged message: " + e.Reason }

// IsForged reports whether err is a forged delivery.
func IsForged(err error) bool {
	var f *Forged
	return errors.As(err, &f)
}

// AsForged returns err as a *forged, or nil.
func AsForged(err error) *Forged {
	var f *Forged
	if errors.As(err, &f) {
		return f
	}
	return nil
}
