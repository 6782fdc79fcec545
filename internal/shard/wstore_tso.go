//go:build amd64 && !race

package shard

import (
	"sync/atomic"
	"unsafe"
)

// The busy bit's holder writes a block's slots, meta and its releasing
// ctl with plain stores on amd64. There the seqlock (block.go) needs no
// more: the processor makes stores visible in program order, none before
// the locked CAS that took the bit, and a reader's loads are not
// reordered either. So a reader whose two ctl loads agree saw none of a
// writer's stores or all of them. Go's compiler keeps stores in program
// order with atomic operations. An atomic store is an XCHG on amd64, a
// full barrier of about 20 cycles, and an accept made four of them. The
// race detector counts these plain stores as races with the readers'
// atomic loads, so builds with -race keep the atomic ones
// (wstore_other.go), as do other architectures, whose stores may be
// reordered.

// wstore32 stores v in *p. Precondition: the caller holds the busy bit of
// the block p is in.
func wstore32(p *atomic.Uint32, v uint32) { *(*uint32)(unsafe.Pointer(p)) = v }

// wstoreSlot stores e in *p, a wide slot (wstore32's precondition).
func wstoreSlot(p *atomic.Int64, e int64) { *(*int64)(unsafe.Pointer(p)) = e }

// wstore64 stores v in *p, a block's meta, or its ctl as the busy bit's
// holder releases it (wstore32's precondition).
func wstore64(p *atomic.Uint64, v uint64) { *(*uint64)(unsafe.Pointer(p)) = v }
