package shard_test

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/shard"
)

// Store-level benchmarks: the decision without the engine's clock read.
// The full comparisons against the textbook log and the peers are in bench/.

func BenchmarkDecideHotKeyAllowed(b *testing.B) {
	s := newStore(b, shard.Config{Limit: 1 << 20, Window: int64(time.Nanosecond) * 1000})
	var now int64
	var r shard.Result
	b.ReportAllocs()
	for b.Loop() {
		now++
		s.Decide("client-42", 1, now, true, &r)
	}
}

func BenchmarkDecideHotKeyRefused(b *testing.B) {
	s := newStore(b, shard.Config{Limit: 10, Window: int64(time.Hour)})
	var r shard.Result
	for i := range 10 {
		s.Decide("client-42", 1, int64(i), true, &r)
	}
	b.ReportAllocs()
	for b.Loop() {
		s.Decide("client-42", 1, 100, true, &r)
	}
}

func BenchmarkDecideHotKeyRefusedCounter(b *testing.B) {
	s := newStore(b, shard.Config{Algorithm: shard.Counter, Limit: 10, Window: int64(time.Hour)})
	var r shard.Result
	s.Decide("client-42", 10, 0, true, &r)
	now := int64(time.Minute)
	b.ReportAllocs()
	for b.Loop() {
		now++
		s.Decide("client-42", 1, now, true, &r)
	}
}

// BenchmarkDecideRingGrowth fills fresh keys from their first request to
// the limit (100), so that each key's ring grows three times (3, 13, then
// 100 instants: the requests come far faster than the window, so from 3
// instants on the ring grows four-fold, or to the limit; docs/design.md,
// "A growth copies with plain stores"). One op is one key's 100 accepted
// requests; the keys are short, as in lab/bench/peers.
func BenchmarkDecideRingGrowth(b *testing.B) {
	const keys, limit = 1 << 12, 100
	names := make([]string, keys)
	for i := range names {
		names[i] = "k" + strconv.Itoa(i)
	}
	var s *shard.Store
	var r shard.Result
	var now int64
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i%keys == 0 {
			b.StopTimer()
			s = newStore(b, shard.Config{Limit: limit, Window: int64(time.Hour), Shards: 1})
			b.StartTimer()
		}
		k := names[i%keys]
		for range limit {
			now++
			s.Decide(k, 1, now, true, &r)
		}
		i++
	}
	if !r.Allowed {
		b.Fatal("the limit-th request was refused")
	}
}

// BenchmarkDecideManyKeys decides over a million short keys ("k0" …, as in
// lab/bench/peers), each holding six requests of a limit of 100, drawn
// uniformly or by Zipf (s = 1.1): the index's lookup misses the cache on
// most decisions. Each key reaches the store as a copy of its bytes, as a
// server builds it per request. One goroutine, so that cachegrind and
// callgrind count a decision's instructions and cache misses.
func BenchmarkDecideManyKeys(b *testing.B) {
	const keys, held = 1 << 20, 6
	names := make([]string, keys)
	for i := range names {
		names[i] = "k" + strconv.Itoa(i)
	}
	for _, dist := range []string{"uniform", "zipf"} {
		b.Run(dist, func(b *testing.B) {
			s := newStore(b, shard.Config{Limit: 100, Window: int64(time.Hour)})
			var r shard.Result
			now := int64(1)
			for range held {
				for _, k := range names {
					s.Decide(k, 1, now, true, &r)
				}
			}
			rng := rand.New(rand.NewPCG(1, 2))
			z := rand.NewZipf(rng, 1.1, 1, keys-1)
			const stream = 1 << 20
			idx := make([]uint32, stream)
			for i := range idx {
				if dist == "zipf" {
					idx[i] = uint32(z.Uint64())
				} else {
					idx[i] = uint32(rng.IntN(keys))
				}
			}
			buf := make([]byte, 0, 16)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				k := names[idx[i%stream]]
				buf = append(buf[:0], k...)
				now++
				s.Decide(string(buf), 1, now, true, &r)
				i++
			}
		})
	}
}

// BenchmarkDecideNewKeysParallel has every goroutine create keys of its
// own (12 bytes, as the load test's clients), give each a second request,
// which grows its first block, and drop it, over the default 64 shards:
// the paths that update the store's statistics, from every core at once.
// One op is one key's three steps. Run it with -cpu 2 or more: with one
// set of counters per shard, the line they share passes between the
// cores.
func BenchmarkDecideNewKeysParallel(b *testing.B) {
	s := newStore(b, shard.Config{Limit: 100, Window: int64(time.Hour)})
	var g atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		id := g.Add(1)
		var r shard.Result
		buf := make([]byte, 0, 16)
		var now int64
		for i := 0; pb.Next(); i++ {
			buf = strconv.AppendInt(append(buf[:0], 'c', byte('a'+id%26)), int64(i%4096)+1e9, 10)
			key := string(buf)
			now++
			s.Decide(key, 1, now, true, &r)
			s.Decide(key, 1, now, true, &r)
			if _, err := s.Drop(key, now); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDecideFewRequests is lab/bench/peers' "few reqs" shape: every
// key holds one request of a limit of 100, then gets one to three more,
// in a shuffled order. Most of its cost is the early growths of the keys'
// rings: it reports the allocations and bytes per decision (one op) to
// two decimals, which -benchmem rounds away. The keys are "k0" … (up to
// 8 bytes, as in lab/bench/peers) and 12-byte ones (as the load test's
// clients send).
func BenchmarkDecideFewRequests(b *testing.B) {
	const keys = 1 << 16
	for _, kl := range []int{7, 12} {
		b.Run("key"+strconv.Itoa(kl), func(b *testing.B) {
			names := make([]string, keys)
			for i := range names {
				names[i] = "k" + strconv.Itoa(i)
				if kl == 12 {
					names[i] = "c" + strconv.FormatInt(1e11+int64(i), 10)[1:]
				}
			}
			rng := rand.New(rand.NewPCG(2, keys))
			var sched []uint32
			for i := range keys {
				for range 1 + rng.IntN(3) {
					sched = append(sched, uint32(i))
				}
			}
			rng.Shuffle(len(sched), func(i, j int) { sched[i], sched[j] = sched[j], sched[i] })
			var s *shard.Store
			var r shard.Result
			var now int64
			var m0, m1 runtime.MemStats
			var mallocs, bytes uint64
			i := 0
			for b.Loop() {
				if i%len(sched) == 0 {
					b.StopTimer()
					if s != nil {
						runtime.ReadMemStats(&m1)
						mallocs, bytes = mallocs+m1.Mallocs-m0.Mallocs, bytes+m1.TotalAlloc-m0.TotalAlloc
					}
					s = newStore(b, shard.Config{Limit: 100, Window: int64(time.Hour), Shards: 1})
					for _, k := range names {
						now++
						s.Decide(k, 1, now, true, &r)
					}
					runtime.ReadMemStats(&m0)
					b.StartTimer()
				}
				now++
				s.Decide(names[sched[i%len(sched)]], 1, now, true, &r)
				i++
			}
			runtime.ReadMemStats(&m1)
			mallocs, bytes = mallocs+m1.Mallocs-m0.Mallocs, bytes+m1.TotalAlloc-m0.TotalAlloc
			b.ReportMetric(float64(mallocs)/float64(i), "mallocs/decision")
			b.ReportMetric(float64(bytes)/float64(i), "B/decision")
		})
	}
}

// BenchmarkStockTakeUsedUp is what a decision that allocates pays the
// stock when its class's batch is used up, as under a demand far above
// what one restock stocks, the allocation itself left out: from every
// core at once (run it with -cpu 2 or more), so that any line the takes
// write passes between the cores.
func BenchmarkStockTakeUsedUp(b *testing.B) {
	s := newStore(b, shard.Config{Limit: 100, Window: int64(time.Hour)})
	s.StockTake(6)
	s.Restock()
	for s.StockTake(6) != nil {
	}
	// Blocks standing for the ones the misses would allocate: their
	// addresses vary as fresh blocks' do.
	blocks := make([][]uint64, 1024)
	for i := range blocks {
		blocks[i] = make([]uint64, 6)
	}
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			if s.StockTakeOr(6, blocks[i%len(blocks)]) != nil {
				b.Error("a block from a used-up batch")
			}
		}
	})
}
