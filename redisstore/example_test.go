package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/redisstore"
)

// Two replicas share one limit through Redis. (Not run by go test: it
// needs a Redis at 127.0.0.1:6379.)
func Example() {
	policy := engine.Policy{Name: "free", Limit: 2, Window: time.Minute}
	var replicas []*redisstore.Limiter
	for range 2 {
		lim, err := redisstore.New("redis://127.0.0.1:6379/0", policy,
			redisstore.WithFailurePolicy(redisstore.FailLocal),
			redisstore.WithTimeout(50*time.Millisecond))
		if err != nil {
			log.Fatal(err)
		}
		defer lim.Close()
		replicas = append(replicas, lim)
	}
	ctx := context.Background()
	for i := range 3 {
		d, err := replicas[i%2].Decide(ctx, "client-42", 1)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(d.Allowed, d.Remaining)
	}
	// A fresh key would print:
	// true 1
	// true 0
	// false 0
}
