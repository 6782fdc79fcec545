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

// TestBatchKeys: batch items the fast path parses carry keys that are
// views of the pooled body buffer too. Through the real listener, many
// goroutines send batches of distinct keys of many lengths, twice each:
// the in-memory engine (which borrows the view) must count each key's own
// two requests, and a backend that keeps the key strings it is handed
// (the recording one) must be handed copies that the next bodies leave
// intact.
func TestBatchKeys(t *testing.T) {
	cfg := mustParse(t, `
policies:
  - {name: log, limit: 5, window: 1h}
  - {name: counter, limit: 5, window: 1h, algorithm: counter}
`)
	rec := &recorder{}
	kept := start(t, cfg, recordingStore(&cfg, rec))
	borrowed := start(t, mustParse(t, `
policies:
  - {name: log, limit: 5, window: 1h}
  - {name: counter, limit: 5, window: 1h, algorithm: counter}
`))
	const goroutines, perG, items = 6, 40, 3
	key := func(g, i, j int) string {
		return fmt.Sprintf("g%d-%s-%d-%d", g, strings.Repeat("k", (g*perG+i*items+j)%61), i, j)
	}
	for _, e := range []*env{borrowed, kept} {
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for round := range 2 {
					for i := range perG {
						var b strings.Builder
						b.WriteByte('[')
						for j := range items {
							if j > 0 {
								b.WriteByte(',')
							}
							fmt.Fprintf(&b, `{"key":%q,"policy":%q}`, key(g, i, j), [...]string{"log", "counter"}[j%2])
						}
						b.WriteByte(']')
						r := e.do("POST", e.base+"/v1/allow/batch", b.String())
						if want := fmt.Sprintf(`"remaining":%d,`, 4-round); r.status != 200 || strings.Count(string(r.body), want) != items {
							t.Errorf("batch %d of goroutine %d, round %d: %d %s, want %s in each item", i, g, round, r.status, r.body, want)
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		for g := range goroutines {
			for i := range perG {
				for j := range items {
					policy := [...]string{"log", "counter"}[j%2]
					b, _ := e.srv.Backend(policy)
					if rb, ok := b.(recordingBackend); ok {
						b = rb.Backend
					}
					st, held, err := b.(engine.KeyAdmin).InspectKey(context.Background(), key(g, i, j))
					if err != nil || !held || st.Used != 2 {
						t.Errorf("%s %s: used %d, held %v, %v; want 2", policy, key(g, i, j), st.Used, held, err)
					}
				}
			}
		}
	}
	seen := map[string]int{}
	for _, r := range rec.Records() {
		seen[r.Key]++
	}
	for g := range goroutines {
		for i := range perG {
			for j := range items {
				if n := seen[key(g, i, j)]; n != 2 {
					t.Errorf("recorded key %s %d times, want 2", key(g, i, j), n)
				}
			}
		}
	}
	if len(seen) != goroutines*perG*items {
		t.Errorf("%d distinct keys recorded, want %d (a key string changed after it was handed over)", len(seen), goroutines*perG*items)
	}
}
