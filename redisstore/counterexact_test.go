package redisstore

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// TestCounterExactProducts runs the counter's arithmetic where its
// products (a count up to 2^32 − 1 times a span of a window up to 366
// days in µs) are far beyond the 2^53 that Lua's doubles hold: the
// single-key and the group scripts decide requests placed exactly on the
// instants where room appears (and 1 µs before), and every field matches
// the reference counter, which computes in exact rationals. Time is in
// µs for both, so RetryAfter matches exactly.
func TestCounterExactProducts(t *testing.T) {
	url := standaloneURL(t)
	ctx := context.Background()
	l := newTestLimiter(t, url, engine.Policy{Name: "ctr-exact", Limit: 1, Window: time.Second, Algorithm: engine.SlidingCounter})
	type result struct {
		allowed               bool
		remaining, retry, rst int64
	}
	// counter decides with the single-key script, group with the group
	// script; L, W (µs) and the cost are the scripts' arguments.
	counter := func(key string, L, W, n, now int64) (result, error) {
		args := []string{strconv.FormatInt(L, 10), strconv.FormatInt(W, 10), strconv.FormatInt(n, 10),
			strconv.FormatInt(now, 10), "", strconv.FormatInt(ceilMillis(2*time.Duration(W)*time.Microsecond)+1, 10)}
		res, err := l.st.conn.eval(ctx, counterScript, key, args)
		if err != nil || len(res) != 5 {
			return result{}, fmt.Errorf("%v %v", res, err)
		}
		return result{res[0] == 1, res[1], res[2], res[3]}, nil
	}
	group := func(key string, L, W, n, now int64) (result, error) {
		// The policy packed as Limiter.gpol: algorithm, L, W, S, TTL.
		pol := fmt.Sprintf("1 %d %d 0 %d", L, W, ceilMillis(2*time.Duration(W)*time.Microsecond)+1)
		args := []string{strconv.FormatInt(now, 10), pol, "", strconv.FormatInt(n, 10)}
		res, err := l.st.conn.evalKeys(ctx, groupScript, []string{key}, args)
		if err != nil || len(res) != 6 {
			return result{}, fmt.Errorf("%v %v", res, err)
		}
		return result{res[0] == 1 && res[2] == 1, res[3], res[4], res[5]}, nil
	}
	const day = int64(24 * time.Hour / time.Microsecond)
	r := rand.New(rand.NewPCG(27, 52))
	steps, beyond, ties := 0, 0, 0
	for _, script := range []struct {
		name   string
		decide func(key string, L, W, n, now int64) (result, error)
	}{{"counter", counter}, {"group", group}} {
		for _, L := range []int64{1 << 30, 1<<32 - 1} {
			for _, W := range []int64{day / 24, day, 366 * day, 366*day - 1} {
				for trial := range 12 {
					key := l.Key(fmt.Sprintf("%s-%d-%d-%d", script.name, L, W, trial))
					model := reference.NewCounter(int(L), W)
					ask := func(n, now int64) bool {
						t.Helper()
						got, err := script.decide(key, L, W, n, now)
						if err != nil {
							t.Fatalf("%s L=%d W=%dµs n=%d at %dµs: %v", script.name, L, W, n, now, err)
						}
						m := model.Decide(key, int(n), now)
						want := result{m.Allowed, int64(m.Remaining), m.RetryAfter, m.Reset}
						if got != want {
							t.Fatalf("%s L=%d W=%dµs n=%d at %dµs (e=%d): got %+v, reference %+v", script.name, L, W, n, now, now%W, got, want)
						}
						steps++
						if float64(L)*float64(W) > 1<<53 {
							beyond++
						}
						return got.allowed
					}
					// The previous window holds P; the current one C, sent
					// at the first instant it fits, then probes of cost n
					// at the first instant each fits, and 1 µs before.
					i0 := 1 + r.Int64N(100)
					P := L - r.Int64N(3)
					if trial%3 == 1 {
						P = L/2 + r.Int64N(L/2)
					}
					for new(big.Int).GCD(nil, nil, big.NewInt(P), big.NewInt(W)).Int64() != 1 {
						P-- // nearTie needs P invertible modulo W
					}
					C := []int64{1, r.Int64N(L / 1024), r.Int64N(L / 4)}[trial%3] + 1
					ask(P, i0*W)
					base, held := (i0+1)*W, int64(0) // held: the current window's count
					e := firstFit(L, W, P, C)
					for _, at := range []int64{e - 1, e} {
						if ask(C, base+at) {
							held += C
						}
					}
					// A near tie: the cost n whose room appears at W − a,
					// where P·a and (L − held − n)·W differ by less than
					// a double's rounding at their size.
					a, k := nearTie(r, W, P)
					if n := L - held - k; n >= 1 && W-a-1 >= e {
						ties++
						for _, at := range []int64{W - a - 1, W - a} {
							if ask(n, base+at) != (at == W-a) {
								t.Fatalf("near tie at %d: room must appear exactly at W − a = %d", at, W-a)
							}
						}
						held += n
						e = W - a
					}
					for range 4 {
						n := 1 + r.Int64N(max(L-held, 1))
						if r.IntN(3) == 0 {
							n = max(L-held+1, 1) + r.Int64N(max(held, 1)) // beyond this window: it waits into the next
						}
						n = min(n, L)
						e2 := firstFit(L, W, P, held+n)
						if e2 >= W {
							// No room in this window: refused, anywhere in it
							// (later asks come no earlier: the watermark).
							e += r.Int64N(W - e)
							ask(n, base+e)
							continue
						}
						for _, at := range []int64{e2 - 1, e2} {
							if at < e {
								continue // before an instant decided already
							}
							e = at
							if ask(n, base+at) {
								held += n
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d decisions compared, %d with limit × window beyond 2^53, %d near ties", steps, beyond, ties)
	if ties < 100 {
		t.Errorf("only %d near ties", ties)
	}
	if beyond < steps/2 {
		t.Errorf("only %d of %d decisions beyond 2^53", beyond, steps)
	}
}

// firstFit is the least e in [1, W] at which a counter holding P in its
// previous window and held in its current one (held ≤ L) has an estimate
// P·(W−e)/W + held ≤ L: W − floor((L−held)·W/P), at least 1 (W: not
// within the window).
func firstFit(L, W, P, held int64) int64 {
	if held > L {
		return W
	}
	f := new(big.Int).Mul(big.NewInt(L-held), big.NewInt(W))
	f.Quo(f, big.NewInt(P))
	if f.Cmp(big.NewInt(W-1)) > 0 {
		return 1
	}
	return W - f.Int64()
}

// nearTie returns a in [W/8, W/2] and k with P·a = k·W − g for some g in
// 1..2^20 (P and W coprime): at e = W − a a previous count P leaves room
// for a cost that leaves k, by less than the products' rounding in
// doubles.
func nearTie(r *rand.Rand, W, P int64) (a, k int64) {
	inv := new(big.Int).ModInverse(big.NewInt(P), big.NewInt(W))
	for {
		g := 1 + r.Int64N(1<<20)
		x := new(big.Int).Mul(big.NewInt(-g), inv)
		x.Mod(x, big.NewInt(W))
		if a = x.Int64(); a < W/8 || a > W/2 {
			continue
		}
		x.Mul(big.NewInt(P), big.NewInt(a))
		x.Add(x, big.NewInt(g))
		return a, x.Quo(x, big.NewInt(W)).Int64()
	}
}
