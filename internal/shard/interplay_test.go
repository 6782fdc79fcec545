package shard_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/shard"
)

// TestSetPolicyReserveSteps: reservations placed into the future, then
// SetPolicy lowering the limit and changing the window, then decisions on
// the same keys, each checked against the documented semantics: entries
// already logged (reservations included) stay, and every decision made
// after the change fits the new policy.
func TestSetPolicyReserveSteps(t *testing.T) {
	newStore := func(t *testing.T, limit int, window int64) *shard.Store {
		t.Helper()
		s, err := shard.New(shard.Config{Algorithm: shard.Log, Limit: limit, Window: window, Shards: 1})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	allow := func(t *testing.T, s *shard.Store, key string, n int, now int64, want bool) shard.Result {
		t.Helper()
		var r shard.Result
		if err := s.Decide(key, n, now, false, &r); err != nil {
			t.Fatal(err)
		}
		if r.Allowed != want {
			t.Fatalf("Decide(%q, %d, %d) = %+v, want allowed %v", key, n, now, r, want)
		}
		return r
	}
	reserve := func(t *testing.T, s *shard.Store, key string, n int, now, want int64) {
		t.Helper()
		var r shard.Result
		at, st, err := s.Reserve(key, n, now, 1<<40, nil, &r)
		if err != nil || st != shard.Reserved || at != want {
			t.Fatalf("Reserve(%q, %d, %d) = %d, %v, %v; want %d, Reserved", key, n, now, at, st, err, want)
		}
	}
	cancel := func(t *testing.T, s *shard.Store, key string, n int, at, now int64, want bool) {
		t.Helper()
		ok, err := s.Cancel(key, n, at, now, nil)
		if err != nil || ok != want {
			t.Fatalf("Cancel(%q, %d, %d, %d) = %v, %v; want %v", key, n, at, now, ok, err, want)
		}
	}
	setPolicy := func(t *testing.T, s *shard.Store, limit int, window int64) {
		t.Helper()
		if err := s.SetPolicy(limit, window, func() int64 { return 0 }); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("lowered limit keeps the reservations", func(t *testing.T) {
		s := newStore(t, 2, 100)
		allow(t, s, "k", 1, 0, true)
		allow(t, s, "k", 1, 0, true)
		reserve(t, s, "k", 1, 0, 100)
		reserve(t, s, "k", 1, 0, 100)
		setPolicy(t, s, 1, 100)
		// Both reservations stay: a lowered limit holds against the log,
		// it removes nothing from it.
		allow(t, s, "k", 1, 50, false)
		reserve(t, s, "k", 1, 60, 200) // the second entry at 100 expires at 200
		cancel(t, s, "k", 1, 100, 70, true)
		cancel(t, s, "k", 1, 100, 70, true)
		// Past every entry but 200: the block is no longer reserved, and
		// more entries are live than the new limit (none are, at 250).
		allow(t, s, "k", 1, 250, false)
		allow(t, s, "k", 1, 300, true)
	})

	t.Run("lowered limit, reserved ring larger than the limit", func(t *testing.T) {
		s := newStore(t, 2, 100)
		allow(t, s, "k", 1, 0, true)
		allow(t, s, "k", 1, 0, true)
		reserve(t, s, "k", 1, 0, 100)
		reserve(t, s, "k", 1, 0, 100)
		setPolicy(t, s, 1, 100)
		// At 150 the reserved instants have come: two live entries, a limit
		// of 1. The refusal turns the block into an ordinary one whose ring
		// holds more than the limit.
		allow(t, s, "k", 1, 150, false)
		allow(t, s, "k", 1, 160, false)
		r := allow(t, s, "k", 1, 200, true)
		if r.Remaining != 0 {
			t.Fatalf("Remaining %d at 200, want 0", r.Remaining)
		}
		allow(t, s, "k", 1, 250, false)
	})

	t.Run("limit lowered far below a reserved ring", func(t *testing.T) {
		for _, initial := range []int64{100, 1 << 50} { // 6-byte and 8-byte slots
			const window = 100
			s := newStore(t, 8, initial)
			setPolicy(t, s, 8, window)
			for range 8 {
				allow(t, s, "k", 1, 0, true)
			}
			for range 8 {
				reserve(t, s, "k", 1, 0, window)
			}
			setPolicy(t, s, 1, window)
			// Eight live entries at window, a limit of 1: refused until
			// they expire at 2 × window, and the block keeps all eight.
			for i := range int64(20) {
				r := allow(t, s, "k", 1, window+window/2+i, false)
				// Remaining is 0 on the reserved path, −7 after (Result).
				if r.RetryAfter != window/2-i || r.Remaining > 0 {
					t.Fatalf("at %d: %+v, want RetryAfter %d", window+window/2+i, r, window/2-i)
				}
			}
			if st := s.Stats(); st.StoredInstants != 8 {
				t.Fatalf("%d stored instants, want 8", st.StoredInstants)
			}
			allow(t, s, "k", 1, 2*window, true)
			allow(t, s, "k", 1, 2*window, false)
		}
	})

	// A cancel in the middle of the queue leaves the later reservations
	// where they are; the next one goes after the newest entry, fitting
	// the policy in force.
	t.Run("mid-queue cancel under a lowered limit", func(t *testing.T) {
		s := newStore(t, 2, 10)
		allow(t, s, "k", 1, 0, true)
		allow(t, s, "k", 1, 0, true)
		reserve(t, s, "k", 1, 0, 10)
		reserve(t, s, "k", 1, 0, 10)
		reserve(t, s, "k", 1, 0, 20)
		cancel(t, s, "k", 1, 10, 1, true)
		setPolicy(t, s, 1, 10)
		// A limit of 1 per 10 with entries at 10 and 20: 10 after 20.
		reserve(t, s, "k", 1, 2, 30)
	})

	t.Run("mid-queue cancel under a longer window", func(t *testing.T) {
		s := newStore(t, 1, 10)
		allow(t, s, "k", 1, 0, true)
		reserve(t, s, "k", 1, 0, 10)
		reserve(t, s, "k", 1, 0, 20)
		cancel(t, s, "k", 1, 10, 1, true)
		setPolicy(t, s, 1, 15)
		// Entries at 0 and 20, one per 15: 15 after 20.
		reserve(t, s, "k", 1, 2, 35)
	})

	t.Run("mid-queue cancel under a shorter window", func(t *testing.T) {
		s := newStore(t, 1, 10)
		allow(t, s, "k", 1, 0, true)
		reserve(t, s, "k", 1, 0, 10)
		reserve(t, s, "k", 1, 0, 20)
		cancel(t, s, "k", 1, 10, 1, true)
		setPolicy(t, s, 1, 5)
		// One per 5: the cancelled instant 10 would fit, but it is before
		// the waiter at 20; the reservation goes 5 after it.
		reserve(t, s, "k", 1, 2, 25)
		allow(t, s, "k", 1, 12, false) // reservations are pending
		reserve(t, s, "k", 1, 12, 30)
	})

	t.Run("mid-queue cancel under the same policy", func(t *testing.T) {
		s := newStore(t, 1, 10)
		allow(t, s, "k", 1, 0, true)
		reserve(t, s, "k", 1, 0, 10)
		reserve(t, s, "k", 1, 0, 20)
		cancel(t, s, "k", 1, 10, 1, true)
		setPolicy(t, s, 1, 10)
		reserve(t, s, "k", 1, 2, 30) // after the waiter at 20, not at 10
	})

	t.Run("lengthened window counts the reservations", func(t *testing.T) {
		s := newStore(t, 2, 10)
		reserve(t, s, "k", 1, 0, 0)
		reserve(t, s, "k", 1, 0, 0)
		reserve(t, s, "k", 1, 0, 10)
		setPolicy(t, s, 2, 30)
		// Entries 0, 0, 10 under 2 per 30: the next fits once the second
		// entry at 0 expires at 30.
		reserve(t, s, "k", 1, 1, 30)
		allow(t, s, "k", 1, 31, false) // 10 and 30 live
		allow(t, s, "k", 1, 40, true)
	})
}

// TestSetPolicyReserveSideTable: SetPolicy changes the limit and window in
// a tight loop while goroutines decide, reserve and cancel on few keys
// (short and long ones) and sweeps run, at GOMAXPROCS 1, 4 and 32. At
// rest after each round, the side table of reserved keys holds exactly
// the keys whose block is reserved; once every entry has expired, a
// sweep drops every key and the side table is empty.
func TestSetPolicyReserveSideTable(t *testing.T) {
	keys := []string{"a", "abcdefghi", strings.Repeat("k", 100)}
	limits := []int{1, 2, 4, 7}
	windows := []int64{20_000, 100_000, 400_000}
	for _, procs := range []int{1, 4, 32} {
		t.Run(fmt.Sprint("GOMAXPROCS=", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			s, err := shard.New(shard.Config{Algorithm: shard.Log, Limit: 4, Window: 100_000, Shards: 2})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			clock := func() int64 { return int64(time.Since(start)) }
			perG := 600
			if raceEnabled {
				perG = 200
			}
			var newest atomic.Int64
			for round := range 3 {
				stop := make(chan struct{})
				var bg, wg sync.WaitGroup
				bg.Add(2)
				go func() {
					defer bg.Done()
					rng := rand.New(rand.NewPCG(uint64(procs), uint64(round)))
					for {
						select {
						case <-stop:
							return
						default:
						}
						if err := s.SetPolicy(limits[rng.IntN(len(limits))], windows[rng.IntN(len(windows))], clock); err != nil {
							t.Error(err)
							return
						}
						runtime.Gosched()
					}
				}()
				go func() {
					defer bg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						if _, err := s.SweepShard(i%s.Shards(), clock()); err != nil {
							t.Error(err)
							return
						}
						runtime.Gosched()
					}
				}()
				for g := range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						type pending struct {
							key string
							n   int
							at  int64
						}
						var held []pending
						for i := range perG {
							key := keys[(g+i)%len(keys)]
							n := 1 + (g+i)%3
							var r shard.Result
							var err error
							switch i % 4 {
							case 0, 1:
								var at int64
								var st shard.ReserveStatus
								at, st, err = s.Reserve(key, n, clock(), 1<<40, clock, &r)
								if err == nil && st == shard.Reserved {
									held = append(held, pending{key, n, at})
									raise(&newest, at)
								}
							case 2:
								if len(held) > 0 {
									j := (g + i) % len(held)
									h := held[j]
									held = append(held[:j], held[j+1:]...)
									_, err = s.Cancel(h.key, h.n, h.at, clock(), clock)
								}
							default:
								err = s.Decide(key, n, clock(), i%8 == 3, &r)
								if err == nil && r.Allowed {
									raise(&newest, r.At)
								}
							}
							// ErrInvalid: a cost above a limit SetPolicy lowered.
							if err != nil && !errors.Is(err, shard.ErrInvalid) {
								t.Errorf("unexpected error: %v", err)
								return
							}
						}
					}()
				}
				wg.Wait()
				close(stop)
				bg.Wait()
				if err := s.CheckReserved(); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
			}
			// newest counts admissions and reservations only, but a cancel,
			// or a reservation that reserved nothing, raises its key's
			// watermark to its own instant (writeBack), which may come long
			// after the last admission on a loaded machine. Every such
			// instant came from clock() before now.
			far := max(newest.Load(), clock()) + 2*windows[len(windows)-1]
			s.Sweep(far)
			if err := s.CheckReserved(); err != nil {
				t.Fatal(err)
			}
			if st := s.Stats(); st.Keys != 0 || st.StoredInstants != 0 {
				t.Fatalf("after every entry expired and a sweep at %d: %+v; keys left: %v", far, st, s.KeyStates())
			}
		})
	}
}

func raise(w *atomic.Int64, t int64) {
	for {
		if old := w.Load(); old >= t || w.CompareAndSwap(old, t) {
			return
		}
	}
}
