package server_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/slidegate/slidegate/engine"
)

// TestBorrowedKeys: the decision API hands the in-memory engine the key
// as a view of the request's pooled body buffer, which the next request
// overwrites. Many goroutines send distinct keys of many lengths, twice
// each, through the real listener; afterwards every key must hold exactly
// its own two requests, under both algorithms. Had the engine kept the
// view (as its map key, say), later bodies would have rewritten the keys
// it holds: lookups would miss and keys would merge. (A backend that keeps
// keys gets a copy: TestParallelReplay's recording backend keeps every key
// string and replays them.)
func TestBorrowedKeys(t *testing.T) {
	e := start(t, mustParse(t, `
policies:
  - {name: log, limit: 5, window: 1h}
  - {name: counter, limit: 5, window: 1h, algorithm: counter}
`))
	const goroutines, perG = 8, 120
	key := func(g, i int) string { return fmt.Sprintf("g%d-%s-%d", g, strings.Repeat("k", (g*perG+i)%61), i) }
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range 2 {
				for i := range perG {
					policy := [...]string{"log", "counter"}[i%2]
					r := e.do("POST", e.base+"/v1/allow", fmt.Sprintf(`{"key":%q,"policy":%q}`, key(g, i), policy))
					if want := fmt.Sprintf(`"remaining":%d,`, 4-round); r.status != 200 || !strings.Contains(string(r.body), want) {
						t.Errorf("%s %s round %d: %d %s, want %s", policy, key(g, i), round, r.status, r.body, want)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, policy := range []string{"log", "counter"} {
		b, _ := e.srv.Backend(policy)
		if got, want := b.(*engine.Limiter).Stats().Keys, goroutines*perG/2; got != want {
			t.Errorf("%s holds %d keys, want %d", policy, got, want)
		}
	}
	for g := range goroutines {
		for i := range perG {
			policy := [...]string{"log", "counter"}[i%2]
			b, _ := e.srv.Backend(policy)
			st, held, err := b.(engine.KeyAdmin).InspectKey(context.Background(), key(g, i))
			if err != nil || !held || st.Used != 2 {
				t.Errorf("%s %s: used %d, held %v, %v; want 2", policy, key(g, i), st.Used, held, err)
			}
		}
	}
}
