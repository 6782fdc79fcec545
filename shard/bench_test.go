package shard_test

import (
	"testing"
	"time"

	"github.com/slidegate/slidegate/shard"
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
