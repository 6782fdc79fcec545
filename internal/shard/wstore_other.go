//go:build !amd64 || race

package shard

import "sync/atomic"

// Atomic stores for the busy bit's holder (see wstore_tso.go).

func wstore32(p *atomic.Uint32, v uint32) { p.Store(v) }
func wstoreSlot(p *atomic.Int64, e int64) { p.Store(e) }
func wstore64(p *atomic.Uint64, v uint64) { p.Store(v) }
