package remote_test

import (
	"context"
	"fmt"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
	"github.com/slidegate/slidegate/remote"
)

// A service's replicas share one limit kept by slidegate serve (here
// started in the example, on a loopback port).
func Example() {
	cfg, err := config.ParseConfig([]byte("listen: 127.0.0.1:0\nadmin: \"off\"\npolicies:\n  - {name: api, limit: 2, window: 1m}\n"))
	if err != nil {
		panic(err)
	}
	srv, err := server.New(cfg, server.WithLogger(quiet))
	if err != nil {
		panic(err)
	}
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()

	// A generous timeout for the example: the default (100 ms) suits a
	// service beside its limiter, not a loaded test machine.
	c, err := remote.Dial("http://"+srv.Addr(), remote.WithTimeout(10*time.Second))
	if err != nil {
		panic(err)
	}
	defer c.Close()
	l, err := c.Limiter(engine.Policy{Name: "api", Limit: 2, Window: time.Minute})
	if err != nil {
		panic(err)
	}
	for range 3 {
		d, err := l.Decide(context.Background(), "alice", 1)
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v remaining=%d retry_after=%v\n", d.Allowed, d.Remaining, d.RetryAfter.Round(time.Minute))
	}
	// Output:
	// allowed=true remaining=1 retry_after=0s
	// allowed=true remaining=0 retry_after=0s
	// allowed=false remaining=0 retry_after=1m0s
}
