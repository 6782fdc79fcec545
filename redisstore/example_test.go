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

// Ten per second and 1,000 per hour on one API key, plus 100 per minute
// per IP, decided all or nothing: one store, its limiters, a group over
// them, and one Close. (Not run by go test: it needs a Redis Cluster at
// 127.0.0.1:7000.)
func ExampleNewGroup() {
	st, err := redisstore.Open("redis-cluster://127.0.0.1:7000")
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close() // closes the limiters and the group too
	ls, err := st.Limiters([]engine.Policy{
		{Name: "per_second", Limit: 10, Window: time.Second},
		{Name: "per_hour", Limit: 1000, Window: time.Hour},
		{Name: "per_ip", Limit: 100, Window: time.Minute},
	})
	if err != nil {
		log.Fatal(err)
	}
	g, err := redisstore.NewGroup(ls...)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	apiKey, ip := "key-42", "192.0.2.7"
	refs := []engine.Ref{{Policy: 0, Key: apiKey}, {Policy: 1, Key: apiKey}, {Policy: 2, Key: ip}}
	// The keys differ: on a cluster, the API key names their slot.
	gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: 1, Tag: apiKey})
	if err != nil {
		log.Fatal(err)
	}
	b := gd.Decision() // the binding limit, for the response headers
	fmt.Println(gd.Allowed, gd.Binding, b.Remaining)
	// A fresh key would print:
	// true 0 9
}
