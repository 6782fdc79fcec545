package engine_test

import (
	"errors"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// FuzzLimiter throws arbitrary policies, keys, costs and instants at the
// engine: it must return an error or a decision equal to the reference
// model's, never panic, and a bad call must not disturb other keys.
func FuzzLimiter(f *testing.F) {
	f.Add(2, int64(60e9), uint8(0), "client-42", 1, int64(0), int64(1e9))
	f.Add(5, int64(1000), uint8(1), "", 3, int64(999), int64(1000))
	f.Add(1, int64(1), uint8(0), "\xff\x00", 0, int64(-5), int64(1))
	f.Add(-1, int64(-1), uint8(9), "k", 1<<30, int64(1<<62), int64(0))
	f.Fuzz(func(t *testing.T, limit int, window int64, alg uint8, key string, n int, t0, dt int64) {
		p := engine.Policy{Limit: limit, Window: time.Duration(window), Algorithm: engine.Algorithm(alg % 3)}
		lim, err := engine.New(p, engine.WithSweepInterval(0))
		if err != nil {
			if !errors.Is(err, engine.ErrInvalidPolicy) {
				t.Fatalf("New(%+v): %v is not ErrInvalidPolicy", p, err)
			}
			return
		}
		defer lim.Close()
		var model reference.Model
		if p.Algorithm == engine.SlidingLog {
			model = reference.NewLog(p.Limit, window)
		} else if p.Limit <= 1<<20 {
			model = reference.NewCounter(p.Limit, window)
		}
		// A neighbour key with one accepted request.
		before, _ := lim.AllowNAt(key+"/neighbour", 1, 0)
		if model != nil {
			model.Decide(key+"/neighbour", 1, 0)
		}
		now := t0
		for i := range 3 {
			if i > 0 && dt > 0 && now <= (1<<62)-dt {
				now += dt
			}
			d, err := lim.AllowNAt(key, n, now)
			switch {
			case n < 1 || n > p.Limit:
				if !errors.Is(err, engine.ErrInvalidCost) {
					t.Fatalf("cost %d with limit %d: err %v", n, p.Limit, err)
				}
				continue
			case now < 0:
				if !errors.Is(err, engine.ErrInvalidInstant) {
					t.Fatalf("instant %d: err %v", now, err)
				}
				continue
			case err != nil:
				t.Fatalf("AllowNAt(%q, %d, %d): %v", key, n, now, err)
			}
			if model != nil {
				want := model.Decide(key, n, now)
				got := reference.Result{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset)}
				if got != want {
					t.Fatalf("%+v key %q n %d t %d: engine %+v, reference %+v", p, key, n, now, got, want)
				}
			}
		}
		// The neighbour still holds its one request.
		after, _ := lim.AllowNAt(key+"/neighbour", 1, before.At)
		if p.Limit > 1 && after.Remaining != p.Limit-2 {
			t.Fatalf("neighbour disturbed: %+v then %+v", before, after)
		}
	})
}
