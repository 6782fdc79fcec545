package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/slidegate/slidegate/internal/shard"
)

// Errors of reservations and waits.
var (
	// ErrWaitTooLong is wrapped, with context.DeadlineExceeded, by the
	// error Wait returns at once when the request could not be admitted
	// before the context's deadline; nothing is reserved.
	ErrWaitTooLong = errors.New("engine: the request would be admitted after the context's deadline")
	// ErrNotReservable is returned by Reserve and Wait on the sliding
	// window counter: it keeps counts, not instants, so it cannot place a
	// request at a later instant exactly.
	ErrNotReservable = errors.New("engine: the sliding window counter cannot reserve")
	// ErrQueueFull is returned when a key already holds its limit plus
	// shard.MaxQueued reserved entries, or a reservation would lie more
	// than MaxReserveAhead ahead; nothing is reserved.
	ErrQueueFull = errors.New("engine: too many reservations queued on the key")
	// ErrKeyOverflow is returned when the key is new, the limiter tracks
	// its WithMaxKeys cap of keys, and WithOverflow refuses.
	ErrKeyOverflow = errors.New("engine: the limiter tracks its maximum number of keys")
	// ErrNilContext is returned by Wait for a nil context.
	ErrNilContext = errors.New("engine: nil context")
	// ErrGivenBack is returned by Reservation.Wait for a reservation that
	// another call gave back: its slot is no longer in the log.
	ErrGivenBack = errors.New("engine: the reservation was given back")
)

// MaxReserveAhead is how far after its decision a reservation may be
// placed (about 39 hours).
const MaxReserveAhead = time.Duration(shard.MaxReserveAhead)

// Reservation is a slot reserved for a request: n entries of the key's log
// (every key's, for a Group) at an instant that may be in the future. The
// slot counts in every window from the moment it is reserved, so the
// request may be sent at At and no window of any limit holds more than its
// limit. Cancel gives it back while At has not come.
//
// A Reservation is safe for concurrent use.
type Reservation struct {
	at, made int64
	stores   []*shard.Store
	keys     []string
	ns       []int
	now      func() int64
	mono     bool
	clock    func() int64 // read under the keys' bits; nil for explicit instants
	wall     func(int64) time.Time
	state    atomic.Int32 // pending, then cancelling, then givenBack or kept
}

// Reservation states: the first Cancel moves a pending reservation to
// cancelling, and then to givenBack or kept.
const (
	pending int32 = iota
	cancelling
	givenBack
	kept
)

// At returns the reserved instant, on the limiter's clock.
func (r *Reservation) At() int64 { return r.at }

// Made returns the instant the reservation was decided at.
func (r *Reservation) Made() int64 { return r.made }

// Delay returns how long after its decision the slot comes.
func (r *Reservation) Delay() time.Duration { return time.Duration(r.at - r.made) }

// DelayFrom returns how long after now the slot comes, 0 if it has.
func (r *Reservation) DelayFrom(now int64) time.Duration { return time.Duration(max(0, r.at-now)) }

// Time returns At as wall time, for display and for timers.
func (r *Reservation) Time() time.Time { return r.wall(r.at) }

// Cancel gives the slot back if its instant has not come and no Wait on
// the reservation has returned nil, and reports whether it did.
// Reservations made after this one keep their instants. Only the first
// Cancel of a reservation can succeed.
func (r *Reservation) Cancel() bool { return r.cancel(r.now(), r.clock) }

// CancelAt is Cancel at an explicit instant of the clock.
func (r *Reservation) CancelAt(now int64) bool { return r.cancel(now, nil) }

func (r *Reservation) cancel(now int64, clock func() int64) bool {
	if now < 0 || r.at <= now || !r.state.CompareAndSwap(pending, cancelling) {
		return false
	}
	var buf [4]shard.Result
	rs := buf[:0]
	if len(r.stores) > len(buf) {
		rs = make([]shard.Result, 0, len(r.stores))
	}
	ok, err := shard.CancelGroup(shard.Claim{Stores: r.stores, Keys: r.keys, Ns: r.ns}, r.at, now, clock, rs[:len(r.stores)])
	ok = err == nil && ok
	if ok {
		r.state.Store(givenBack)
	} else {
		r.state.Store(kept)
	}
	return ok
}

// keep marks a reservation whose slot has come as kept, so that no later
// Cancel (CancelAt an earlier instant, say) takes it back from a request
// that was sent; it reports false when a Cancel gave it back first.
func (r *Reservation) keep() bool {
	return r.state.CompareAndSwap(pending, kept) || r.settled() == kept
}

// settled returns the reservation's state once no Cancel is under way.
func (r *Reservation) settled() int32 {
	for {
		if st := r.state.Load(); st != cancelling {
			return st
		}
		runtime.Gosched() // a Cancel holds the keys' bits for a moment
	}
}

// reserveError turns a reservation that did not happen into an error.
func reserveError(st shard.ReserveStatus, at, now int64) error {
	switch st {
	case shard.QueueFull:
		return ErrQueueFull
	case shard.Overflow:
		return ErrKeyOverflow
	}
	if at-now > shard.MaxReserveAhead {
		return ErrQueueFull
	}
	return fmt.Errorf("%w (in %v): %w", ErrWaitTooLong, time.Duration(at-now), context.DeadlineExceeded)
}

// Reserve reserves a slot of cost 1 for key at the earliest instant at
// which it fits, now or later; see ReserveN.
func (l *Limiter) Reserve(key string) (*Reservation, error) { return l.ReserveN(key, 1) }

// ReserveN reserves a slot of cost n for key at the earliest instant at
// which it fits that is no earlier than now or any slot already reserved
// on the key: reservations of one key are served in the order they are
// made. The slot is logged at once, so a request decided by Allow while
// it is pending is refused (RetryAfter says when it would fit): no request
// goes ahead of a waiter. It returns an error, reserving nothing, for n
// outside 1..Limit, the sliding window counter (ErrNotReservable), a key
// holding too many reservations (ErrQueueFull) or a full limiter
// (ErrKeyOverflow).
func (l *Limiter) ReserveN(key string, n int) (*Reservation, error) {
	return l.reserve(key, n, l.Now(), math.MaxInt64, l.clockFn())
}

// clockFn returns the limiter's clock for decisions made under the keys'
// bits (see shard.Reserve), or nil when it is not the monotonic one.
func (l *Limiter) clockFn() func() int64 {
	if l.mono {
		return l.Now
	}
	return nil
}

// ReserveNAt is ReserveN at an explicit instant of the clock (≥ 0).
func (l *Limiter) ReserveNAt(key string, n int, now int64) (*Reservation, error) {
	if now < 0 {
		return nil, fmt.Errorf("%w: %d is before the clock's epoch", ErrInvalidInstant, now)
	}
	return l.reserve(key, n, now, math.MaxInt64, nil)
}

func (l *Limiter) reserve(key string, n int, now, maxAt int64, clock func() int64) (*Reservation, error) {
	if n < 1 || n > l.store.KeyLimit(key) {
		return nil, l.costError(key, n)
	}
	if l.Policy().Algorithm != SlidingLog {
		return nil, ErrNotReservable
	}
	var r shard.Result
	at, st, err := l.store.Reserve(key, n, now, maxAt, clock, &r)
	if err != nil {
		return nil, l.costError(key, n) // only the cost can be out of range: SetPolicy lowered the limit
	}
	if st != shard.Reserved {
		return nil, reserveError(st, at, r.At)
	}
	return &Reservation{at: at, made: r.At, stores: []*shard.Store{l.store}, keys: []string{key}, ns: []int{n},
		now: l.Now, mono: l.mono, clock: l.clockFn(), wall: l.WallTime}, nil
}

// Wait blocks until a request of cost 1 for key is admitted; see WaitN.
func (l *Limiter) Wait(ctx context.Context, key string) error { return l.WaitN(ctx, key, 1) }

// WaitN blocks until a request of cost n for key is admitted, and returns
// nil: its slot, reserved as ReserveN does, has come, and the request is
// in the log at that instant. Waiters of one key are admitted in the
// order they called, each at its own slot, so a wake-up never races other
// waiters. WaitN returns an error, and leaves nothing reserved, when ctx
// is done before the slot comes (ctx.Err()), when the slot would come
// after ctx's deadline (at once, wrapping ErrWaitTooLong and
// context.DeadlineExceeded), for a nil ctx, and in the cases of ReserveN.
//
// Waits sleep on timers; with a clock other than the monotonic one they
// look at the clock at least every millisecond.
func (l *Limiter) WaitN(ctx context.Context, key string, n int) error {
	_, err := l.WaitReserved(ctx, key, n)
	return err
}

// WaitReserved is WaitN that also returns the reservation it waited for:
// its At is the instant the request was admitted at.
func (l *Limiter) WaitReserved(ctx context.Context, key string, n int) (*Reservation, error) {
	if ctx == nil {
		return nil, ErrNilContext
	}
	if n < 1 || n > l.store.KeyLimit(key) {
		return nil, l.costError(key, n)
	}
	return wait(ctx, l.Now, l.mono, func(now, maxAt int64) (*Reservation, error) {
		return l.reserve(key, n, now, maxAt, l.clockFn())
	})
}

// wait reserves through reserve and sleeps until the slot comes, cancelling
// it when ctx is done first.
func wait(ctx context.Context, now func() int64, mono bool, reserve func(now, maxAt int64) (*Reservation, error)) (*Reservation, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t := now()
	maxAt := int64(math.MaxInt64)
	if dl, ok := ctx.Deadline(); ok {
		maxAt = t + int64(time.Until(dl))
	}
	r, err := reserve(t, maxAt)
	if err != nil {
		return nil, err
	}
	return r, r.wait(ctx, mono)
}

// Wait blocks until the slot comes and returns nil, or gives the slot
// back and returns ctx.Err() if ctx is done first (nil if the slot came
// before it could be given back). It returns ErrGivenBack, or ctx.Err()
// once ctx is done, when another call has given the slot back.
func (r *Reservation) Wait(ctx context.Context) error {
	if ctx == nil {
		return ErrNilContext
	}
	return r.wait(ctx, r.mono)
}

func (r *Reservation) wait(ctx context.Context, mono bool) error {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		d := r.DelayFrom(r.now())
		if d <= 0 {
			if r.keep() {
				return nil
			}
			return ErrGivenBack
		}
		if r.settled() == givenBack {
			return ErrGivenBack
		}
		if !mono {
			d = min(d, time.Millisecond)
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			if r.Cancel() || !r.keep() {
				return ctx.Err()
			}
			return nil // the slot came first: the request is admitted
		case <-timer.C:
		}
	}
}

// Reserve reserves a slot of cost 1 on every key at once; see ReserveN.
func (g *Group) Reserve(keys []string) (*Reservation, error) { return g.ReserveN(keys, 1) }

// ReserveN reserves, all or nothing, a slot of cost n on keys[i] of every
// policy i at the earliest instant at which every limit fits, as
// Limiter.ReserveN does for one. It returns an error, reserving nothing,
// for a wrong number of keys, n outside 1..the smallest limit, a policy on
// the sliding window counter, and the cases of Limiter.ReserveN.
func (g *Group) ReserveN(keys []string, n int) (*Reservation, error) {
	if err := g.check(keys, n); err != nil {
		return nil, err
	}
	return g.reserve(keys, n, g.Now(), math.MaxInt64, g.clockFn())
}

// ReserveNAt is ReserveN at an explicit instant of the clock (≥ 0).
func (g *Group) ReserveNAt(keys []string, n int, now int64) (*Reservation, error) {
	if err := g.check(keys, n); err != nil {
		return nil, err
	}
	if now < 0 {
		return nil, fmt.Errorf("%w: %d is before the clock's epoch", ErrInvalidInstant, now)
	}
	return g.reserve(keys, n, now, math.MaxInt64, nil)
}

// clockFn is Limiter.clockFn for the group's clock.
func (g *Group) clockFn() func() int64 {
	if g.mono {
		return g.Now
	}
	return nil
}

func (g *Group) reserve(keys []string, n int, now, maxAt int64, clock func() int64) (*Reservation, error) {
	for _, p := range g.policies {
		if p.Algorithm != SlidingLog {
			return nil, ErrNotReservable
		}
	}
	// The bits are taken in (store ID, key) order; see shard.DecideGroup.
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(g.stores[a].ID(), g.stores[b].ID()) })
	r := &Reservation{now: g.Now, mono: g.mono, clock: g.clockFn(), wall: g.WallTime}
	for _, i := range order {
		r.stores = append(r.stores, g.stores[i])
		r.keys = append(r.keys, keys[i])
		r.ns = append(r.ns, n)
	}
	rs := make([]shard.Result, len(keys))
	at, st, err := shard.ReserveGroup(shard.Claim{Stores: r.stores, Keys: r.keys, Ns: r.ns}, now, maxAt, clock, rs)
	if err != nil {
		return nil, fmt.Errorf("%w: %d is above a limit of the group", ErrInvalidCost, n) // SetPolicy lowered it
	}
	if st != shard.Reserved {
		return nil, reserveError(st, at, rs[0].At)
	}
	r.at, r.made = at, rs[0].At
	return r, nil
}

// Wait blocks until a request of cost 1 on every key is admitted; see
// WaitN.
func (g *Group) Wait(ctx context.Context, keys []string) error { return g.WaitN(ctx, keys, 1) }

// WaitN is Limiter.WaitN over every limit of the group at once: it blocks
// until the earliest instant at which every limit admits the request, all
// or nothing.
func (g *Group) WaitN(ctx context.Context, keys []string, n int) error {
	_, err := g.WaitReserved(ctx, keys, n)
	return err
}

// WaitReserved is WaitN that also returns the reservation it waited for.
func (g *Group) WaitReserved(ctx context.Context, keys []string, n int) (*Reservation, error) {
	if ctx == nil {
		return nil, ErrNilContext
	}
	if err := g.check(keys, n); err != nil {
		return nil, err
	}
	return wait(ctx, g.Now, g.mono, func(now, maxAt int64) (*Reservation, error) {
		return g.reserve(keys, n, now, maxAt, g.clockFn())
	})
}
