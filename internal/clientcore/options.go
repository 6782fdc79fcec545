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
