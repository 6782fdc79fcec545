package engine_test

import (
	"fmt"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// Reservations at explicit instants: two per minute, so the third and
// fourth callers get slots when the first two leave the window, each in
// the order it asked; an Allow meanwhile is refused rather than going
// ahead of them, and a cancelled slot goes to the next caller.
func ExampleLimiter_ReserveNAt() {
	lim, _ := engine.New(engine.Policy{Limit: 2, Window: time.Minute})
	defer lim.Close()
	s := int64(time.Second)
	for i, now := range []int64{0, 0, 10 * s, 20 * s} {
		r, _ := lim.ReserveNAt("partner-api", 1, now)
		fmt.Printf("caller %d at %v: slot at %v\n", i+1, time.Duration(now), time.Duration(r.At()))
	}
	d, _ := lim.AllowNAt("partner-api", 1, 30*s)
	fmt.Printf("Allow at 30s: allowed %v, retry after %v\n", d.Allowed, d.RetryAfter)
	r, _ := lim.ReserveNAt("partner-api", 1, 31*s)
	fmt.Printf("caller 5: slot at %v; cancelled at 32s: %v\n", time.Duration(r.At()), r.CancelAt(32*s))
	r, _ = lim.ReserveNAt("partner-api", 1, 33*s)
	fmt.Printf("caller 6: slot at %v\n", time.Duration(r.At()))
	// Output:
	// caller 1 at 0s: slot at 0s
	// caller 2 at 0s: slot at 0s
	// caller 3 at 10s: slot at 1m0s
	// caller 4 at 20s: slot at 1m0s
	// Allow at 30s: allowed false, retry after 1m30s
	// caller 5: slot at 2m0s; cancelled at 32s: true
	// caller 6: slot at 2m0s
}
