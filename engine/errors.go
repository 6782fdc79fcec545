package engine

import "errors"

// Errors returned by the engine. Errors about a policy are *PolicyError
// values, which wrap ErrInvalidPolicy; the others wrap one of these with
// fmt.Errorf, so test them with errors.Is.
var (
	ErrInvalidPolicy  = errors.New("engine: invalid policy")
	ErrInvalidCost    = errors.New("engine: invalid cost")
	ErrInvalidOption  = errors.New("engine: invalid option")
	ErrInvalidInstant = errors.New("engine: invalid instant")
)

// PolicyError reports a policy the engine cannot use: which field is at
// fault and why. It wraps ErrInvalidPolicy, so errors.Is(err,
// ErrInvalidPolicy) holds; use errors.As to read the field, for example
// to point at the right key of a configuration file.
type PolicyError struct {
	// Field is the field at fault, in lower case: "algorithm", "limit"
	// or "window".
	Field string
	// Reason says what is wrong with it, without the "engine: invalid
	// policy: " prefix ("limit 0 must be at least 1").
	Reason string
}

// Error returns "engine: invalid policy: " followed by the reason.
func (e *PolicyError) Error() string { return ErrInvalidPolicy.Error() + ": " + e.Reason }

// Unwrap returns ErrInvalidPolicy.
func (e *PolicyError) Unwrap() error { return ErrInvalidPolicy }
