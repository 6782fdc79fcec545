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
type Listener struct {
	inner   net.Listener
	cfg     Config
	perAddr int
	high    int
	exempt  atomic.Pointer[func(netip.Addr) bool]
	start   sync.Once
	done    chan struct{} // closed when the accept goroutine returns

	mu      sync.Mutex
	cond    *sync.Cond // broadcast on every change below
	open    int        // admitted and not yet closed
	idle    idleList   // oldest idle first
	addrs   map[netip.Addr]*addrConns
	ready   []*Conn // admitted, not yet returned by Accept
	waiting int     // connections waiting for their address's slot
	tempErr error   // a temporary Accept error for Accept to return
	loopErr error   // why the accept goroutine stopped
	started bool
	closed  bool
}

// addrConns are one address's connections: open, and waiting for a slot.
type addrConns struct {
	conns   map[*Conn]struct{}
	waiting []*Conn
}

// New wraps inner. cfg.MaxConns must be positive.
func New(inner net.Listener, cfg Config) *Listener {
	if cfg.MaxConns < 1 {
		panic("connlimit: MaxConns must be positive")
	}
	l := &Listener{inner: inner, cfg: cfg, addrs: map[netip.Addr]*addrConns{}, done: make(chan struct{})}
	l.cond = sync.NewCond(&l.mu)
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
	// prev and next link c in its Listener's idle list while it is idle
	// (inIdle); closing: evicted or closed, no longer a candidate. l.mu
	// guards the four.
	prev, next *Conn
	inIdle     bool
	closing    bool
	once       sync.Once
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
	c.closing = true
	l.idle.remove(c)
	l.open--
	if a := l.addrs[c.addr]; c.addr.IsValid() && a != nil {
		delete(a.conns, c)
		if len(a.waiting) > 0 && len(a.conns) < l.perAddr && l.open < l.cfg.MaxConns && !l.closed {
			w := a.waiting[0]
			a.waiting = a.waiting[1:]
			l.waiting--
			l.admitLocked(w)
		}
		if len(a.conns) == 0 && len(a.waiting) == 0 {
			delete(l.addrs, c.addr)
		}
	}
	l.cond.Broadcast()
	l.mu.Unlock()
}

// ConnState tracks which connections are idle; give it to
// http.Server.ConnState (it ignores connections of other listeners). A
// connection turning idle while its address has one waiting is closed,
// so that the waiting one is served.
func (l *Listener) ConnState(nc net.Conn, st http.ConnState) {
	c, ok := nc.(*Conn)
	if !ok || c.l != l {
		return
	}
	l.mu.Lock()
	if c.closing {
		l.mu.Unlock()
		return
	}
	evict := false
	switch st {
	case http.StateIdle:
		if a := l.addrs[c.addr]; c.addr.IsValid() && a != nil && len(a.waiting) > 0 {
			c.closing, evict = true, true
			l.idle.remove(c)
		} else if !c.inIdle {
			l.idle.pushBack(c)
			l.cond.Broadcast()
		}
	default:
		l.idle.remove(c)
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
		l.cond.Wait()
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
				l.cond.Broadcast()
				l.mu.Unlock()
				return
			}
			l.tempErr = err // Accept returns it; http.Server logs it and retries
			l.cond.Broadcast()
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
			switch v := l.oldestIdleOf(a); {
			case v != nil:
				evict = append(evict, l.evictLocked(v))
			case len(a.waiting) < l.perAddr && !l.closed:
				a.waiting = append(a.waiting, c)
				l.waiting++
				l.mu.Unlock()
				return
			default:
				l.mu.Unlock()
				_ = nc.Close()
				l.report(ReasonPerAddr)
				return
			}
		}
	}
	// An evicted connection holds its slot until closed, below, so each
	// one counts as freed already.
	for l.open-len(evict) >= l.cfg.MaxConns && !l.closed {
		if v := l.oldestIdle(); v != nil {
			evict = append(evict, l.evictLocked(v))
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
		l.cond.Wait()
	}
	if l.closed {
		l.mu.Unlock()
		_ = nc.Close()
		l.closeEvicted(evict)
		return
	}
	if l.open-len(evict) >= l.high {
		if v := l.oldestIdle(); v != nil {
			evict = append(evict, l.evictLocked(v))
		}
	}
	l.admitLocked(c)
	l.mu.Unlock()
	l.closeEvicted(evict)
}

// admitLocked counts c open and makes it ready for Accept; l.mu held.
func (l *Listener) admitLocked(c *Conn) {
	l.open++
	if c.addr.IsValid() {
		a := l.addrs[c.addr]
		if a == nil {
			a = &addrConns{conns: map[*Conn]struct{}{}}
			l.addrs[c.addr] = a
		}
		a.conns[c] = struct{}{}
	}
	l.ready = append(l.ready, c)
	l.cond.Broadcast()
}

// evictLocked takes v out of the candidates; the caller closes it once
// l.mu is released. l.mu held.
func (l *Listener) evictLocked(v *Conn) *Conn {
	l.idle.remove(v)
	v.closing = true
	return v
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

// oldestIdle returns the connection idle the longest, or nil; l.mu held.
func (l *Listener) oldestIdle() *Conn {
	return l.idle.head
}

// oldestIdleOf returns a's connection idle the longest, or nil; l.mu held.
func (l *Listener) oldestIdleOf(a *addrConns) *Conn {
	for c := l.idle.head; c != nil; c = c.next {
		if _, ok := a.conns[c]; ok {
			return c
		}
	}
	return nil
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

// Open returns the connections open now (admitted and not closed).
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Idle returns the connections idle now (between requests).
func (l *Listener) Idle() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.idle.n
}

// Waiting returns the connections waiting for their address's slot.
func (l *Listener) Waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting
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
		a.waiting = nil
	}
	l.waiting = 0
	started := l.started
	l.cond.Broadcast()
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

// idleList is a list of idle connections linked through their prev and
// next fields, so that a connection turning idle allocates nothing. Its
// Listener's mu guards it.
type idleList struct {
	head, tail *Conn
	n          int
}

// pushBack appends c, which is not in the list.
func (q *idleList) pushBack(c *Conn) {
	c.prev, c.next, c.inIdle = q.tail, nil, true
	if q.tail != nil {
		q.tail.next = c
	} else {
		q.head = c
	}
	q.tail = c
	q.n++
}

// remove takes c out of the list, if it is in it.
func (q *idleList) remove(c *Conn) {
	if !c.inIdle {
		return
	}
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		q.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		q.tail = c.prev
	}
	c.prev, c.next, c.inIdle = nil, nil, false
	q.n--
}
