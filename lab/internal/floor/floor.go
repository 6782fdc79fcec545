// Package floor is the floor the lab sets beside slidegate's decision:
// not a limiter, but what any design that keeps its keys in an xsync map
// must do per decision (read the clock, find the key, load one word).
// The load test's engine phase and peerbench's floor row both run it.
package floor

import (
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
)

// Map is the floor's state: one word per key, and the epoch its clock
// reads count from.
type Map struct {
	Words *xsync.MapOf[string, *atomic.Int64]
	Epoch time.Time
}

// New is the floor with keys inserted beforehand (as the engine's are
// once it has seen them); with none, every key is inserted on its first
// decision.
func New(keys []string) *Map {
	f := &Map{Words: xsync.NewMapOf[string, *atomic.Int64](xsync.WithPresize(len(keys))), Epoch: time.Now()}
	for _, k := range keys {
		f.Words.Store(k, new(atomic.Int64))
	}
	return f
}

// Allow is the floor's decision. It reads the clock first, as the engine
// does, so that the clock read cannot overlap the lookup's cache misses.
func (f *Map) Allow(key string) bool {
	now := int64(time.Since(f.Epoch))
	v, ok := f.Words.Load(key)
	if !ok {
		v, _ = f.Words.LoadOrStore(key, new(atomic.Int64))
	}
	return now >= v.Load()
}
