package wire

import (
	"fmt"
	"strconv"
)

// Error replies follow the NATS micro convention: a reply whose header
// Nats-Service-Error holds a text is an error, and Nats-Service-Error-Code
// holds its code, three digits in the manner of HTTP. The node answers
// local programs this way, a program's handler fails a request or a
// command this way, and the codes below are what each side may rely on.
//
// The rules:
//   - A reply is an error when it has a text, or when its code is
//     CodePermanent (a handler's permanent refusal may come without words).
//     A code alone otherwise is no error: the body is the answer.
//   - Codes 503 and 504 are transient: the same call may succeed later.
//     Every other code is the answer to this input.
//   - A handler's code is the program's word: read it as it was sent
//     (ReadError), never trust it to be a number.
const (
	HeaderServiceError     = "Nats-Service-Error"
	HeaderServiceErrorCode = "Nats-Service-Error-Code"
)

// Error codes carried in HeaderServiceErrorCode.
const (
	CodeBadInput    = 400 // malformed request, invalid subject or header, oversized payload
	CodeForbidden   = 403 // the program or node may not do this (a permission, a scope)
	CodeNotFound    = 404 // no such node in the mesh, no such blob
	CodePermanent   = 422 // from a handler: the command must not be tried again (dead-lettered at once)
	CodeInternal    = 500 // the node failed (an outbox write error)
	CodeUnavailable = 503 // mesh unreachable, no host, node gone or shutting down
	CodeTimeout     = 504 // the deadline passed
	CodeOutboxFull  = 507 // the outbox is full: the message was not accepted
)

// NATS's own status header on a reply it makes itself: StatusNoResponders
// when nobody subscribes to the subject of a request.
const (
	HeaderStatus       = "Status"
	StatusNoResponders = "503"
)

// Transient says whether a call that failed with code may succeed later.
func Transient(code int) bool { return code == CodeUnavailable || code == CodeTimeout }

// ServiceError is an error reply: its code and its text.
type ServiceError struct {
	Code int
	Text string
}

func (e *ServiceError) Error() string { return fmt.Sprintf("%d %s", e.Code, e.Text) }

// SetError makes h the headers of an error reply.
func SetError(h map[string][]string, code int, text string) {
	h[HeaderServiceError] = []string{text}
	h[HeaderServiceErrorCode] = []string{strconv.Itoa(code)}
}

// ReadError reads the error of a reply's headers as they were sent: its
// code (possibly empty, possibly not a number) and text. isError follows
// the rules above.
func ReadError(h map[string][]string) (code, text string, isError bool) {
	code, text = first(h, HeaderServiceErrorCode), first(h, HeaderServiceError)
	return code, text, text != "" || code == strconv.Itoa(CodePermanent)
}

// ErrorOf returns the error a reply's headers carry, or nil when it is an
// answer. A code that is not a number reads as 0.
func ErrorOf(h map[string][]string) *ServiceError {
	code, text, ok := ReadError(h)
	if !ok {
		return nil
	}
	n, _ := strconv.Atoi(code)
	return &ServiceError{Code: n, Text: text}
}

// NoResponders says whether a reply is NATS's own "no responders" status.
func NoResponders(h map[string][]string, data []byte) bool {
	return len(data) == 0 && first(h, HeaderStatus) == StatusNoResponders
}

func first(h map[string][]string, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}
