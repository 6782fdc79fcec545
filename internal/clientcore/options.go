package clientcore

import (
	"fmt"
	"time"
)

// Positive is the check of an option that takes a duration: it sets *dst
// to d if d is positive; an error names the option (what) and wraps
// invalid.
func Positive(dst *time.Duration, d time.Duration, what string, invalid error) error {
	if d <= 0 {
		return fmt.Errorf("%w: %s %v must be positive", invalid, what, d)
	}
	*dst = d
	return nil
}

// SetPolicy is WithFailurePolicy: it sets *dst to a valid f; an error
// wraps invalid.
func SetPolicy(dst *Policy, f Policy, invalid error) error {
	if !f.Valid() {
		return fmt.Errorf("%w: failure policy %d", invalid, int(f))
	}
	*dst = f
	return nil
}

// SetBreaker is WithBreaker: threshold 0 disables the breaker, otherwise
// the cooldown must be positive; an error wraps invalid.
func SetBreaker(dstThreshold *int, dstCooldown *time.Duration, threshold int, cooldown time.Duration, invalid error) error {
	if threshold < 0 {
		return fmt.Errorf("%w: breaker threshold %d is negative", invalid, threshold)
	}
	if threshold > 0 && cooldown <= 0 {
		return fmt.Errorf("%w: breaker cooldown %v must be positive", invalid, cooldown)
	}
	*dstThreshold, *dstCooldown = threshold, cooldown
	return nil
}

// SetHook is WithFallbackHook: it sets *dst to a non-nil f; an error
// wraps invalid.
func SetHook(dst *func(key string, cause error), f func(key string, cause error), invalid error) error {
	if f == nil {
		return fmt.Errorf("%w: nil fallback hook", invalid)
	}
	*dst = f
	return nil
}

// AtLeast is the check of an option that takes a count: it sets *dst to
// n if n is at least least; an error names the option (what) and wraps
// invalid.
func AtLeast(dst *int, n, least int, what string, invalid error) error {
	if n < least {
		return fmt.Errorf("%w: %s %d must be at least %d", invalid, what, n, least)
	}
	*dst = n
	return nil
}

// Apply applies opts to cfg in order, skipping nil options; it stops at
// the first error.
func Apply[C any, O ~func(*C) error](cfg *C, opts []O) error {
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(cfg); err != nil {
			return err
		}
	}
	return nil
}

// Unavailable is why a backend did not decide: which backend (Backend,
// e.g. "slidegate", at Server) and what happened (Cause). It never holds
// a request's key. It is the cause the failure policy decides on.
type Unavailable struct {
	Backend, Server string
	Cause           error
}

func (e *Unavailable) Error() string {
	return fmt.Sprintf("%s at %s did not decide: %v", e.Backend, e.Server, e.Cause)
}

func (e *Unavailable) Unwrap() error { return e.Cause }

// NonZero is the check of an option that refuses a nil or empty value: it
// sets *dst to v unless v is T's zero value, for which the error says
// refusal (e.g. "nil clock") and wraps invalid.
func NonZero[T comparable](dst *T, v T, refusal string, invalid error) error {
	var zero T
	if v == zero {
		return fmt.Errorf("%w: %s", invalid, refusal)
	}
	*dst = v
	return nil
}
