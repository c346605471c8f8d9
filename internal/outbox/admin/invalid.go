package admin

import (
	"errors"
	"fmt"
)

// InvalidError is input the outbox refuses. Its Error is for a log; its
// Reason says why in words for the person who sent the input, as the admin
// API's problem detail and the ops page's forms say it. errors.Is matches
// its kind (ErrInvalidEndpoint, destination.ErrInvalid, ErrInvalidReplay,
// ErrInvalidFilter or ErrInvalidStatus) and the refusal it comes from.
type InvalidError struct {
	kind   error
	cause  error
	reason string
}

// invalid refuses input of kind, for the reason format says.
func invalid(kind error, format string, args ...any) error {
	return &InvalidError{kind: kind, reason: fmt.Sprintf(format, args...)}
}

// invalidAs refuses input of kind because of cause, the refusal of one of
// its parts: field, when not empty, names that part for the sender.
func invalidAs(kind error, field string, cause error) error {
	reason := Reason(cause)
	if field != "" {
		reason = field + ": " + reason
	}
	return &InvalidError{kind: kind, cause: cause, reason: reason}
}

// Error is the kind and what refused the input: the reason, or the whole
// chain of the refusal it comes from, with the actions that wrapped it.
func (e *InvalidError) Error() string {
	if e.cause != nil {
		return e.kind.Error() + ": " + e.cause.Error()
	}
	return e.kind.Error() + ": " + e.reason
}

// Unwrap is the kind and the refusal it comes from, for errors.Is and
// errors.As.
func (e *InvalidError) Unwrap() []error {
	if e.cause != nil {
		return []error{e.kind, e.cause}
	}
	return []error{e.kind}
}

// Reason is why, for the person who sent the input: "url: scheme "ftp" is
// not http or https", "from must be before to".
func (e *InvalidError) Reason() string { return e.reason }

// Reason is why err refused its input, for the person who sent it: the
// Reason of the outermost error in err's chain that has one (an
// *InvalidError, or a refusal it comes from, such as the SSRF guard's), or
// else err's text.
func Reason(err error) string {
	var r interface{ Reason() string }
	if errors.As(err, &r) {
		return r.Reason()
	}
	return err.Error()
}
