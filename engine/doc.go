// Package engine is slidegate's rate limiter: for each client key it
// decides whether one more request fits a limit defined over a sliding
// window.
//
// # Semantics
//
// A [Policy] is a limit L and a window W. With the default algorithm,
// [SlidingLog], each key has a log of the instants of its accepted requests.
// A request of cost n at instant t sees the live entries, those e with
// e > t−W (the window is (t−W, t]: an entry made exactly W ago has
// expired), and is allowed iff live + n ≤ L, in which case n entries of t
// are appended. A refused request changes nothing, so being refused never
// prolongs a block. At no instant do more than L accepted requests fall
// inside any interval of length W, and no request is refused while it would
// fit. [Decision] defines every field; docs/semantics.md works through
// traces.
//
// [SlidingCounter] keeps two fixed-window counts per key instead of a log
// and allows iff prev·(W−e)/W + cur + n ≤ L, where e is the time elapsed in
// the current window. It costs 32 bytes of state per key (and the key's
// bytes) whatever the limit, and errs both ways; docs/algorithms.md
// measures by how much.
//
// # Types
//
// [New] builds a [Limiter] for one Policy. [Limiter.Allow] and
// [Limiter.AllowN] decide at the clock's current instant;
// [Limiter.AllowNAt] takes the instant explicitly. The Decision they return is a plain value: Allowed, Limit, Remaining,
// RetryAfter (waiting exactly that long guarantees the same request fits),
// Reset and At. Errors are only for bad input: an invalid Policy or Option
// from New (a [*PolicyError], which wraps [ErrInvalidPolicy], naming the
// field at fault; [ErrInvalidOption]), a cost outside 1..Limit from AllowN
// ([ErrInvalidCost]). [NewGroup] decides several limits at once, all or
// nothing ([Group.AllowN]).
//
// # Time
//
// Decisions read a [Clock] of monotonic nanoseconds (by default Go's
// monotonic clock, as an offset from the limiter's creation), never the wall
// clock, so NTP steps change nothing. [Limiter.WallTime] maps an instant to
// wall time for display. Per key, time never goes backwards. [ManualClock]
// moves only when told to, for tests.
//
// # Concurrency
//
// A Limiter is safe for concurrent use. A decision on a known key takes no
// mutex: a key is hashed once, with a secret seed, to a cache-line-padded
// shard and a bucket of its index, which lookups read without a lock, and
// a key's state is one block updated with atomic loads and
// compare-and-swap (internal/shard). A shard's mutex is taken only to
// create a key's block, to store a grown one in its place, or to drop one. Concurrent decisions on one key are
// linearizable: ordering them by Decision.At and replaying them through a
// plain model reproduces them (docs/design.md).
//
// A background goroutine drops idle keys (whose log is empty); Close stops
// it. [WithMaxKeys] bounds how many keys a limiter tracks, so that a flood of
// distinct keys cannot grow its memory without bound.
//
// # Example
//
//	lim, err := engine.New(engine.Policy{Name: "free", Limit: 100, Window: time.Minute})
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer lim.Close()
//	if d := lim.Allow(clientID); !d.Allowed {
//		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.RetryAfter.Seconds()))))
//		http.Error(w, "rate limited", http.StatusTooManyRequests)
//		return
//	}
package engine
