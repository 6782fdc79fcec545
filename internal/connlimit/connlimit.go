// Package connlimit bounds a listener's connections so that no client can
// hold the listener: a cap on the connections open at once, a cap per
// client address, and, when the listener nears its cap, idle keep-alive
// connections closed first (oldest idle first), as nginx does when it runs
// out of worker connections. The server's HTTP listeners use it.
//
// A Listener learns which connections are idle from http.Server's
// ConnState hook: pass Listener.ConnState to it (or call it from the
// server's own hook).
package connlimit

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Config bounds a Listener. MaxConns is required; the zero value of every
// other field means "off".
type Config struct {
	// MaxConns bounds the connections open at once. Past HighWater
	// sixteenths of it, each new connection closes the oldest idle one;
	// at it, with none idle, new connections wait (accepted, unserved)
	// until one closes.
	MaxConns int
	// MaxPerAddr bounds the connections of one client address (IPv4
	// address, IPv6 network of IPv6Prefix bits); it is lowered to half of
	// MaxConns, so that one address can never hold the listener. A new
	// connection beyond it closes the address's oldest idle connection;
	// with none idle it waits, unserved and holding no slot, until one of
	// the address's connections closes; and with as many waiting as the
	// cap, it is closed at once. 0: no cap per address.
	MaxPerAddr int
	// IPv6Prefix groups IPv6 addresses for MaxPerAddr (0: 64).
	IPv6Prefix int
	// Exempt, when set, names addresses MaxPerAddr does not apply to
	// (trusted proxies, whose connections carry many clients). It may be
	// replaced while serving with SetExempt.
	Exempt func(netip.Addr) bool
	// OnClose, when set, is called (without locks held) for every
	// connection the Listener closes itself, with the reason: ReasonPerAddr
	// or ReasonIdle.
	OnClose func(reason string)
}

// Reasons a Listener closes a connection, for Config.OnClose.
const (
	// ReasonPerAddr: a new connection of an address with its cap of
	// connections open and as many waiting, closed before anything was
	// read from it.
	ReasonPerAddr = "per_address"
	// ReasonIdle: an idle keep-alive connection closed to make room.
	ReasonIdle = "idle_evicted"
)

// HighWater is the share of MaxConns, in sixteenths, past which every new
// connection closes the oldest idle one: a margin, so that a client
// arriving at a busy listener rarely has to wait for a close.
const HighWater = 14

// Listener is a net.Listener whose connections Config bounds. A goroutine
// of its own accepts from the wrapped listener (so that a connection
// waiting for its address's slot does not hold up the others); it stops
// when the Listener is closed. A Listener is safe for concurrent use.
//
// The idle tracking takes no lock on a request's path: a connection
// turning idle or busy (ConnState, twice per keep-alive request) updates
// one atomic word of its own slot. A new connection near the cap scans
// the slots for the oldest idle one, under the Listener's mutex: that
// costs a read of one word per open connection (about 80 KB at 10,000),
// and only past the high-water mark.
type Listener struct {
	inner   net.Listener
	cfg     Config
	perAddr int
	high    int
	epoch   time.Time // origin of the idle stamps
	exempt  atomic.Pointer[func(netip.Addr) bool]
	start   sync.Once
	done    chan struct{} // closed when the accept goroutine returns
	// roomWaiters counts admits waiting for an idle connection or a free
	// slot: a connection turning idle takes the mutex to wake them only
	// when there is one.
	roomWaiters atomic.Int32

	mu sync.Mutex
	// accepted is broadcast when ready, tempErr, loopErr or closed
	// change (Accept waits on it); room when a slot frees, a
	// connection turns idle with roomWaiters set, or the Listener
	// closes (admit waits on it).
	accepted, room *sync.Cond
	open           int // admitted and not yet closed
	slots          slotTable
	addrs          map[netip.Addr]*addrConns
	ready          []*Conn // admitted, not yet returned by Accept
	waiting        int     // connections waiting for their address's slot
	tempErr        error   // a temporary Accept error for Accept to return
	loopErr        error   // why the accept goroutine stopped
	started        bool
	closed         bool
}

// addrConns are one address's connections: open, and waiting for a slot.
type addrConns struct {
	conns   map[*Conn]struct{}
	waiting []*Conn
	// watch is len(waiting), plus one while admit looks for an idle
	// connection of the address: a connection of the address turning
	// idle reads it, without the mutex, to know whether to close itself
	// for a waiting one.
	watch atomic.Int32
}

// New wraps inner. cfg.MaxConns must be positive.
func New(inner net.Listener, cfg Config) *Listener {
	if cfg.MaxConns < 1 {
		panic("connlimit: MaxConns must be positive")
	}
	l := &Listener{inner: inner, cfg: cfg, addrs: map[netip.Addr]*addrConns{}, done: make(chan struct{}), epoch: time.Now()}
	l.accepted = sync.NewCond(&l.mu)
	l.room = sync.NewCond(&l.mu)
	l.perAddr = cfg.MaxPerAddr
	if half := max(1, cfg.MaxConns/2); l.perAddr > half {
		l.perAddr = half
	}
	l.high = cfg.MaxConns * HighWater / 16
	l.SetExempt(cfg.Exempt)
	return l
}

// PerAddr returns the cap per address in force (0: none).
func (l *Listener) PerAddr() int { return l.perAddr }

// SetExempt replaces Config.Exempt, for connections accepted from now on.
func (l *Listener) SetExempt(f func(netip.Addr) bool) {
	if f == nil {
		l.exempt.Store(nil)
		return
	}
	l.exempt.Store(&f)
}

// Conn is a connection accepted by a Listener.
type Conn struct {
	net.Conn
	l    *Listener
	addr netip.Addr // the address key; invalid when not capped
	ac   *addrConns // addr's entry while c is open; nil when not capped
	// word is c's slot's word (see slotTable), gen c's generation in
	// it; slot its index. The Listener sets them before Accept returns c.
	word *atomic.Uint64
	gen  uint64
	slot int
	once sync.Once
	dl   deadlines // deadline.go
}

// Close closes the connection and frees its slot.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// release frees c's slot, and hands it to a connection of c's address
// waiting for one.
func (c *Conn) release() {
	l := c.l
	l.mu.Lock()
	l.slots.free(c)
	l.open--
	if a := l.addrs[c.addr]; c.addr.IsValid() && a != nil {
		delete(a.conns, c)
		if len(a.waiting) > 0 && len(a.conns) < l.perAddr && l.open < l.cfg.MaxConns && !l.closed {
			w := a.waiting[0]
			a.waiting = a.waiting[1:]
			a.watch.Add(-1)
			l.waiting--
			l.admitLocked(w)
		}
		if len(a.conns) == 0 && len(a.waiting) == 0 {
			delete(l.addrs, c.addr)
		}
	}
	l.room.Broadcast()
	l.mu.Unlock()
}

// ConnState tracks which connections are idle; give it to
// http.Server.ConnState (it ignores connections of other listeners). A
// connection turning idle while its address has one waiting is closed,
// so that the waiting one is served. It takes no lock unless a
// connection waits for room.
func (l *Listener) ConnState(nc net.Conn, st http.ConnState) {
	c, ok := nc.(*Conn)
	if !ok || c.l != l {
		return
	}
	if st != http.StateIdle {
		c.setStamp(0) // busy, or leaving: no longer a candidate
		return
	}
	if !c.setStamp(l.stamp()) {
		return // evicted or closed meanwhile
	}
	// The stamp is stored before the counters are read, and admit counts
	// itself before it scans: one of the two sees the other.
	if a := c.ac; a != nil && a.watch.Load() > 0 {
		l.idleWithWaiting(c)
		return
	}
	if l.roomWaiters.Load() > 0 {
		l.mu.Lock()
		l.room.Broadcast()
		l.mu.Unlock()
	}
}

// idleWithWaiting closes c, just turned idle, if its address has a
// connection waiting for a slot.
func (l *Listener) idleWithWaiting(c *Conn) {
	l.mu.Lock()
	evict := len(c.ac.waiting) > 0 && c.claimIdle()
	if !evict {
		l.room.Broadcast() // as for any connection turning idle
	}
	l.mu.Unlock()
	if evict {
		l.closeEvicted([]*Conn{c})
	}
}

// Accept returns the next connection that fits the bounds, as a *Conn.
func (l *Listener) Accept() (net.Conn, error) {
	l.start.Do(func() {
		l.mu.Lock()
		closed := l.closed
		l.started = !closed
		l.mu.Unlock()
		if closed {
			close(l.done)
			return
		}
		go l.acceptLoop()
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.ready) == 0 && l.tempErr == nil && l.loopErr == nil && !l.closed {
		l.accepted.Wait()
	}
	switch {
	case l.closed:
		return nil, net.ErrClosed
	case len(l.ready) > 0:
		c := l.ready[0]
		l.ready[0] = nil
		l.ready = l.ready[1:]
		return c, nil
	case l.tempErr != nil:
		err := l.tempErr
		l.tempErr = nil
		return nil, err
	}
	return nil, l.loopErr
}

// acceptLoop accepts from the wrapped listener until it fails for good,
// admitting each connection or setting it waiting.
func (l *Listener) acceptLoop() {
	defer close(l.done)
	var backoff time.Duration
	for {
		nc, err := l.inner.Accept()
		if err != nil {
			l.mu.Lock()
			var ne net.Error
			temporary := isTemporary(err) || (errors.As(err, &ne) && ne.Timeout())
			if l.closed || errors.Is(err, net.ErrClosed) || !temporary {
				l.loopErr = err
				l.accepted.Broadcast()
				l.mu.Unlock()
				return
			}
			l.tempErr = err // Accept returns it; http.Server logs it and retries
			l.accepted.Broadcast()
			l.mu.Unlock()
			// As http.Server does on a temporary error (too many open
			// files): back off, up to a second.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		l.admit(nc)
	}
}

// isTemporary reports whether err is an Accept error worth retrying
// (EMFILE, ENFILE, ECONNABORTED and the like).
func isTemporary(err error) bool {
	t, ok := err.(interface{ Temporary() bool })
	return ok && t.Temporary()
}

// admit applies the bounds to a new connection: it is admitted (made
// ready for Accept), set waiting for its address's slot, or closed.
func (l *Listener) admit(nc net.Conn) {
	c := &Conn{Conn: nc, l: l}
	key, capped := l.addrKey(nc.RemoteAddr())
	var evict []*Conn
	l.mu.Lock()
	if capped {
		c.addr = key
		if a := l.addrs[key]; a != nil && len(a.conns) >= l.perAddr {
			a.watch.Add(1) // before the scan: see ConnState
			switch v := l.oldestIdleOf(a); {
			case v != nil:
				a.watch.Add(-1)
				evict = append(evict, v)
			case len(a.waiting) < l.perAddr && !l.closed:
				a.waiting = append(a.waiting, c) // its count stays in a.watch
				l.waiting++
				l.mu.Unlock()
				return
			default:
				a.watch.Add(-1)
				l.mu.Unlock()
				_ = nc.Close()
				l.report(ReasonPerAddr)
				return
			}
		}
	}
	// An evicted connection holds its slot until closed, below, so each
	// one counts as freed already.
	if l.open-len(evict) >= l.cfg.MaxConns && !l.closed {
		l.roomWaiters.Add(1) // before the scan: see ConnState
		for l.open-len(evict) >= l.cfg.MaxConns && !l.closed {
			if v := l.oldestIdle(); v != nil {
				evict = append(evict, v)
				continue
			}
			if len(evict) > 0 {
				// Close them before waiting, so that none lingers open.
				l.mu.Unlock()
				l.closeEvicted(evict)
				evict = nil
				l.mu.Lock()
				continue
			}
			l.room.Wait()
		}
		l.roomWaiters.Add(-1)
	}
	if l.closed {
		l.mu.Unlock()
		_ = nc.Close()
		l.closeEvicted(evict)
		return
	}
	if l.open-len(evict) >= l.high {
		if v := l.oldestIdle(); v != nil {
			evict = append(evict, v)
		}
	}
	l.admitLocked(c)
	l.mu.Unlock()
	l.closeEvicted(evict)
}

// admitLocked counts c open, gives it a slot and makes it ready for
// Accept; l.mu held.
func (l *Listener) admitLocked(c *Conn) {
	l.open++
	l.slots.take(c)
	if c.addr.IsValid() {
		a := l.addrs[c.addr]
		if a == nil {
			a = &addrConns{conns: map[*Conn]struct{}{}}
			l.addrs[c.addr] = a
		}
		a.conns[c] = struct{}{}
		c.ac = a
	}
	l.ready = append(l.ready, c)
	l.accepted.Broadcast()
}

func (l *Listener) closeEvicted(cs []*Conn) {
	for _, v := range cs {
		_ = v.Close()
		l.report(ReasonIdle)
	}
}

func (l *Listener) report(reason string) {
	if l.cfg.OnClose != nil {
		l.cfg.OnClose(reason)
	}
}

// oldestIdle claims the connection idle the longest and returns it, or
// nil when none is idle; l.mu held. The caller closes it once l.mu is
// released.
func (l *Listener) oldestIdle() *Conn {
	for {
		i, w := l.slots.oldest()
		if i < 0 {
			return nil
		}
		if c := l.slots.conns[i]; c.word.CompareAndSwap(w, w|stampClaimed) {
			return c
		}
		// It turned busy, or idle again, since the scan: scan again.
	}
}

// oldestIdleOf claims a's connection idle the longest and returns it, or
// nil; l.mu held.
func (l *Listener) oldestIdleOf(a *addrConns) *Conn {
	for {
		var best *Conn
		var bw uint64
		for c := range a.conns {
			if w := c.word.Load(); idleWord(w, c.gen) && (best == nil || w&stampMask < bw&stampMask) {
				best, bw = c, w
			}
		}
		if best == nil || best.word.CompareAndSwap(bw, bw|stampClaimed) {
			return best
		}
	}
}

// addrKey returns the address key of a peer, and false when MaxPerAddr
// does not apply to it.
func (l *Listener) addrKey(ra net.Addr) (netip.Addr, bool) {
	if l.perAddr == 0 {
		return netip.Addr{}, false
	}
	ap, err := netip.ParseAddrPort(ra.String())
	if err != nil {
		return netip.Addr{}, false
	}
	a := ap.Addr().Unmap().WithZone("")
	if f := l.exempt.Load(); f != nil && (*f)(a) {
		return netip.Addr{}, false
	}
	if a.Is6() {
		bits := l.cfg.IPv6Prefix
		if bits <= 0 || bits > 128 {
			bits = 64
		}
		p, _ := a.Prefix(bits)
		a = p.Addr()
	}
	return a, true
}

// Close closes the listener and the connections it accepted but did not
// hand out (waiting, or ready for Accept), and waits for its accept
// goroutine; Accept then returns net.ErrClosed.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	ready := l.ready
	l.ready = nil
	var waiting []*Conn
	for _, a := range l.addrs {
		waiting = append(waiting, a.waiting...)
		a.watch.Add(-int32(len(a.waiting)))
		a.waiting = nil
	}
	l.waiting = 0
	started := l.started
	l.accepted.Broadcast()
	l.room.Broadcast()
	l.mu.Unlock()
	err := l.inner.Close()
	if started {
		<-l.done
	}
	for _, c := range ready {
		_ = c.Close()
	}
	for _, c := range waiting {
		_ = c.Conn.Close() // never admitted: it holds no slot
	}
	return err
}

// Addr returns the listener's address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// A slot's word is a connection's idle state: its generation in the top
// genBits bits (the slot's count of owners, so that a connection whose
// slot has moved on to another cannot touch it), and a stamp in the rest:
// 0 while the connection is busy; the time it turned idle, in
// microseconds from the Listener's epoch (plus one), while it is idle;
// stampClaimed once it is evicted or closed. The connection's own
// ConnState sets busy and idle stamps; an evictor claims an idle word
// by compare-and-swap, so that exactly one of the two wins.
const (
	genBits      = 16
	stampBits    = 64 - genBits
	stampMask    = 1<<stampBits - 1
	stampClaimed = stampMask
	slotChunk    = 256 // words per chunk of the slot table
)

// idleWord reports whether w is an idle stamp of generation gen.
func idleWord(w, gen uint64) bool {
	s := w & stampMask
	return w>>stampBits == gen && s != 0 && s != stampClaimed
}

// stamp is the idle stamp of now: microseconds from l.epoch, plus one,
// so that it is never 0 (busy) or stampClaimed (for 8 years).
func (l *Listener) stamp() uint64 {
	return min(uint64(time.Since(l.epoch)/time.Microsecond)+1, stampClaimed-1)
}

// setStamp sets c's stamp (0: busy) unless c is claimed; false when it
// is. Only c's ConnState calls it, one call at a time, so the loop runs
// again only when an evictor claimed c meanwhile.
func (c *Conn) setStamp(s uint64) bool {
	for {
		w := c.word.Load()
		if w>>stampBits != c.gen || w&stampMask == stampClaimed {
			return false
		}
		if w&stampMask == s || c.word.CompareAndSwap(w, c.gen<<stampBits|s) {
			return true
		}
	}
}

// claimIdle claims c's word for its closing if c is idle, and reports
// whether it did.
func (c *Conn) claimIdle() bool {
	for {
		w := c.word.Load()
		if !idleWord(w, c.gen) {
			return false
		}
		if c.word.CompareAndSwap(w, w|stampClaimed) {
			return true
		}
	}
}

// slotTable holds the idle words of a Listener's open connections, in
// chunks that never move (a connection keeps a pointer to its word), with
// the connection of each slot and the free slots. Its Listener's mu
// guards it; the words themselves are atomic.
type slotTable struct {
	chunks []*[slotChunk]atomic.Uint64
	conns  []*Conn // by slot; nil when free
	freed  []int   // free slots, reused last in, first out
}

// word returns slot i's word.
func (t *slotTable) word(i int) *atomic.Uint64 { return &t.chunks[i/slotChunk][i%slotChunk] }

// take gives c a slot, busy, with the slot's next generation.
func (t *slotTable) take(c *Conn) {
	var i int
	if n := len(t.freed); n > 0 {
		i = t.freed[n-1]
		t.freed = t.freed[:n-1]
	} else {
		i = len(t.conns)
		t.conns = append(t.conns, nil)
		if i/slotChunk == len(t.chunks) {
			t.chunks = append(t.chunks, new([slotChunk]atomic.Uint64))
		}
	}
	w := t.word(i)
	c.slot, c.word, c.gen = i, w, (w.Load()>>stampBits+1)&(1<<genBits-1)
	t.conns[i] = c
	w.Store(c.gen << stampBits)
}

// free claims c's word (no ConnState of c changes it from then on) and
// frees its slot.
func (t *slotTable) free(c *Conn) {
	c.word.Store(c.gen<<stampBits | stampClaimed)
	t.conns[c.slot] = nil
	t.freed = append(t.freed, c.slot)
}

// oldest returns the slot of the connection idle the longest and its
// word, or -1. It reads the words only: a slot's word carries its
// connection's generation while the slot is taken, and is claimed while
// it is free.
func (t *slotTable) oldest() (int, uint64) {
	best, bw := -1, uint64(0)
	n := len(t.conns)
	for ci, ch := range t.chunks {
		for j := range min(slotChunk, n-ci*slotChunk) {
			w := ch[j].Load()
			if s := w & stampMask; s != 0 && s != stampClaimed && (best < 0 || s < bw&stampMask) {
				best, bw = ci*slotChunk+j, w
			}
		}
	}
	return best, bw
}
