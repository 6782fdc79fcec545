package engine_test

import (
	"fmt"
	"time"

	"github.com/slidegate/slidegate/engine"
)

func Example() {
	lim, err := engine.New(engine.Policy{Name: "free", Limit: 100, Window: time.Minute})
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	d := lim.Allow("client-42")
	fmt.Println(d.Allowed, d.Remaining, d.Limit)
	// Output: true 99 100
}

// The basic trace, L = 2 per 60 s, on a manual clock: the third request
// is refused, and the window slides by exactly W (an entry made W ago has
// expired).
func ExampleNewManualClock() {
	clk := engine.NewManualClock()
	lim, err := engine.New(engine.Policy{Limit: 2, Window: time.Minute}, engine.WithClock(clk))
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	for _, sec := range []int{0, 1, 2, 60, 60, 61} {
		clk.Set(time.Duration(sec) * time.Second)
		d := lim.Allow("client-42")
		fmt.Printf("t=%-2d allowed=%-5v remaining=%d retry-after=%v\n", sec, d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// t=0  allowed=true  remaining=1 retry-after=0s
	// t=1  allowed=true  remaining=0 retry-after=0s
	// t=2  allowed=false remaining=0 retry-after=58s
	// t=60 allowed=true  remaining=0 retry-after=0s
	// t=60 allowed=false remaining=0 retry-after=1s
	// t=61 allowed=true  remaining=0 retry-after=0s
}

func ExampleLimiter_AllowN() {
	clk := engine.NewManualClock()
	lim, err := engine.New(engine.Policy{Limit: 10, Window: 10 * time.Second}, engine.WithClock(clk))
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	d, _ := lim.AllowN("batch-job", 8)
	fmt.Println(d.Allowed, d.Remaining)
	clk.Advance(3 * time.Second)
	d, _ = lim.AllowN("batch-job", 5) // needs 3 more slots than are free
	fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)
	_, err = lim.AllowN("batch-job", 11) // more than the limit can ever allow
	fmt.Println(err)
	// Output:
	// true 2
	// false 2 7s
	// engine: invalid cost: 11 is outside 1..10
}

func ExamplePolicy_counter() {
	clk := engine.NewManualClock()
	lim, err := engine.New(engine.Policy{Limit: 100, Window: time.Minute, Algorithm: engine.SlidingCounter}, engine.WithClock(clk))
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	lim.AllowN("c", 80) // 80 in the previous window
	clk.Set(time.Minute + 15*time.Second)
	lim.AllowN("c", 30) // 30 in the current one, 15 s in: 80·45/60 + 30 = 90
	// estimate 90: one more fits, leaving 9.
	d := lim.Allow("c")
	fmt.Println(d.Allowed, d.Remaining)
	// Output: true 9
}

// Two limits on one client, decided all or nothing: 2 per second and 3 per
// hour. The third request is refused by the per-second limit; the last one
// by the hourly limit, though the per-second limit has room, and neither
// limit counts a refused request (the per-second limit still has 2 left).
func ExampleNewGroup() {
	clk := engine.NewManualClock()
	g, err := engine.NewGroup([]engine.Policy{
		{Name: "per_second", Limit: 2, Window: time.Second},
		{Name: "per_hour", Limit: 3, Window: time.Hour},
	}, engine.WithClock(clk))
	if err != nil {
		panic(err)
	}
	defer g.Close()

	keys := []string{"u1", "u1"} // keys[i] counts against policy i
	for _, at := range []time.Duration{0, 0, 0, 2 * time.Second, 3 * time.Second} {
		clk.Set(at)
		gd, err := g.AllowN(keys, 1)
		if err != nil {
			panic(err)
		}
		b := gd.Limits[gd.Binding]
		fmt.Printf("t=%v allowed=%-5v binding=%s remaining=%d/%d retry-after=%v\n",
			at, gd.Allowed, g.Policies()[gd.Binding].Name, gd.Limits[0].Remaining, gd.Limits[1].Remaining, b.RetryAfter)
	}
	// Output:
	// t=0s allowed=true  binding=per_second remaining=1/2 retry-after=0s
	// t=0s allowed=true  binding=per_second remaining=0/1 retry-after=0s
	// t=0s allowed=false binding=per_second remaining=0/1 retry-after=1s
	// t=2s allowed=true  binding=per_hour remaining=1/0 retry-after=0s
	// t=3s allowed=false binding=per_hour remaining=2/0 retry-after=59m57s
}
