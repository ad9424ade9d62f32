package codec

import (
	"errors"
	"fmt"
	"strings"

	"github.com/meshbox/meshbox/internal/seal"
)

// The sealed companions of the reason headers.
const (
	HeaderDeadReasonSealed = HeaderDeadReason + SealedReasonSuffix
	HeaderLastReasonSealed = HeaderLastReason + SealedReasonSuffix
	HeaderReplayedSealed   = HeaderReplayed + SealedReasonSuffix

	SealedReasonSuffix = "-Sealed"
	ReasonADLabel      = "meshbox reason v1"
)

// Classed is a failure whose text may hold a program's words: its class
// says what happened in the node's own.
type Classed interface {
	error
	class() string
}

// FailureClass is the class of err: the node's own words. An error that
// is not classed holds none of a program's words: its text is its class.
func FailureClass(err error) string {
	var c Classed
	if errors.As(err, &c) {
		return c.class()
	}
	return err.Error()
}

// DeadReason is a dead-letter reason that is not a decoding error: its
// full text and its class.
type DeadReason struct{ text, cls string }

func (r *DeadReason) Error() string { return r.text }

func (r *DeadReason) class() string { return r.cls }

// Reasonf is the dead-letter reason prefix followed by failure.
func Reasonf(prefix string, failure error) *DeadReason {
	return &DeadReason{text: prefix + failure.Error(), cls: prefix + FailureClass(failure)}
}

// PlainReason is a dead-letter reason in the node's own words only.
func PlainReason(text string) *DeadReason { return &DeadReason{text: text, cls: text} }

// HandlerError is a handler's error reply: its code and its own text.
type HandlerError struct {
	Stage, Node, Code, Text string
}

func (e *HandlerError) Error() string {
	return fmt.Sprintf("handler of stage %s on node %s replied error %s %s", e.Stage, e.Node, e.Code, e.Text)
}

// class names the code only when it is one (the program sets it too).
func (e *HandlerError) class() string {
	if len(e.Code) == 3 && strings.Trim(e.Code, "0123456789") == "" {
		return fmt.Sprintf("handler of stage %s on node %s replied error %s", e.Stage, e.Node, e.Code)
	}
	return fmt.Sprintf("handler of stage %s on node %s replied an error", e.Stage, e.Node)
}

// class of a refused sealed message: a malformed one's detail may quote
// what was inside the seal.
func (e *UnsealError) class() string {
	if e.Reason == UnsealMalformed {
		return "sealed message refused (" + e.Reason + ")"
	}
	return e.Error()
}

// ReasonAD is the associated data of a sealed reason (see above).
func ReasonAD(name, class, rkey, msgID, keyID, scope string) []byte {
	if scope == "" {
		return seal.AssociatedData(nil, ReasonADLabel, name, class, rkey, msgID, keyID)
	}
	return seal.AssociatedData(nil, ReasonADLabel, name, class, rkey, msgID, keyID, scope)
}

// JoinReason is the stored form of an outbox dead letter's reason (record
// reason): the class, then a NUL and the text when it says more. A
// record stored before classes existed reads as a class alone.
func JoinReason(r error) string {
	text, class := r.Error(), FailureClass(r)
	if text == class {
		return text
	}
	return class + "\x00" + text
}

// SplitReason reads JoinReason's form.
func SplitReason(s string) (class, text string) {
	if c, t, ok := strings.Cut(s, "\x00"); ok {
		return c, t
	}
	return s, s
}
