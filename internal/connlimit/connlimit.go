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
	"container/list"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Config bounds a Listener. MaxConns is required; the zero value of every
// other field means "off".
type Config struct {
	// MaxConns bounds the connections open at once. A new connection
	// beyond it closes the oldest idle one; with none idle, it waits
	// (unserved, in the Listener) until one closes.
	MaxConns int
	// MaxPerAddr bounds the connections of one client address (IPv4
	// address, IPv6 network of IPv6Prefix bits); it is lowered to half of
	// MaxConns, so that one address can never hold the listener. A new
	// connection beyond it closes the address's oldest idle connection,
	// or, with none idle, is closed at once. 0: no cap per address.
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
	// ReasonPerAddr: a new connection over its address's cap, closed
	// before anything was read from it.
	ReasonPerAddr = "per_address"
	// ReasonIdle: an idle keep-alive connection closed to make room.
	ReasonIdle = "idle_evicted"
)

// HighWater is the share of MaxConns, in sixteenths, past which every new
// connection closes the oldest idle one: a margin, so that a client
// arriving at a busy listener rarely has to wait for a close.
const HighWater = 14

// ErrClosed is returned by Accept once the Listener is closed.
var ErrClosed = errors.New("connlimit: listener closed")

// Listener is a net.Listener whose connections Config bounds. It is safe
// for concurrent use.
type Listener struct {
	inner   net.Listener
	cfg     Config
	perAddr int
	high    int
	exempt  atomic.Pointer[func(netip.Addr) bool]

	mu     sync.Mutex
	cond   *sync.Cond // signalled when a slot frees or a connection turns idle
	open   int
	idle   list.List // of *Conn, oldest idle first
	addrs  map[netip.Addr]*addrConns
	closed bool
}

// addrConns are one address's open connections.
type addrConns struct {
	conns map[*Conn]struct{}
}

// New wraps inner. cfg.MaxConns must be positive.
func New(inner net.Listener, cfg Config) *Listener {
	if cfg.MaxConns < 1 {
		panic("connlimit: MaxConns must be positive")
	}
	l := &Listener{inner: inner, cfg: cfg, addrs: map[netip.Addr]*addrConns{}}
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
	l       *Listener
	addr    netip.Addr // the address key; invalid when not capped
	idleAt  *list.Element
	closing bool // evicted or closed: no longer a candidate
	once    sync.Once
}

// Close closes the connection and frees its slot.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.l.release(c))
	return err
}

// release returns the function that frees c's slot.
func (l *Listener) release(c *Conn) func() {
	return func() {
		l.mu.Lock()
		l.dropLocked(c)
		l.open--
		l.cond.Broadcast()
		l.mu.Unlock()
	}
}

// dropLocked removes c from the idle list and its address; l.mu held.
func (l *Listener) dropLocked(c *Conn) {
	c.closing = true
	if c.idleAt != nil {
		l.idle.Remove(c.idleAt)
		c.idleAt = nil
	}
	if c.addr.IsValid() {
		if a := l.addrs[c.addr]; a != nil {
			delete(a.conns, c)
			if len(a.conns) == 0 {
				delete(l.addrs, c.addr)
			}
		}
	}
}

// ConnState tracks which connections are idle; give it to
// http.Server.ConnState (it ignores connections of other listeners).
func (l *Listener) ConnState(nc net.Conn, st http.ConnState) {
	c, ok := nc.(*Conn)
	if !ok || c.l != l {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.closing {
		return
	}
	switch st {
	case http.StateIdle:
		if c.idleAt == nil {
			c.idleAt = l.idle.PushBack(c)
			l.cond.Broadcast()
		}
	default:
		if c.idleAt != nil {
			l.idle.Remove(c.idleAt)
			c.idleAt = nil
		}
	}
}

// Accept waits for a connection that fits the bounds and returns it as a
// *Conn.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.inner.Accept()
		if err != nil {
			return nil, err
		}
		if c, ok := l.admit(nc); ok {
			return c, nil
		}
	}
}

// admit applies the bounds to a new connection: it returns it wrapped, or
// false when it was closed (over its address's cap, or the listener
// closed while it waited).
func (l *Listener) admit(nc net.Conn) (*Conn, bool) {
	c := &Conn{Conn: nc, l: l}
	key, capped := l.addrKey(nc.RemoteAddr())
	var evict []*Conn
	l.mu.Lock()
	if capped && l.perAddr > 0 {
		if a := l.addrs[key]; a != nil && len(a.conns) >= l.perAddr {
			v := l.oldestIdleOf(a)
			if v == nil {
				l.mu.Unlock()
				_ = nc.Close()
				l.report(ReasonPerAddr)
				return nil, false
			}
			evict = append(evict, l.evictLocked(v))
		}
	}
	// An evicted connection holds its slot until closed, below, so each
	// one counts as freed already.
	for l.open-len(evict) >= l.cfg.MaxConns && !l.closed {
		if v := l.oldestIdle(); v != nil {
			evict = append(evict, l.evictLocked(v))
			continue
		}
		l.cond.Wait()
	}
	if l.closed {
		l.mu.Unlock()
		_ = nc.Close()
		l.closeEvicted(evict)
		return nil, false
	}
	if l.open-len(evict) >= l.high {
		if v := l.oldestIdle(); v != nil {
			evict = append(evict, l.evictLocked(v))
		}
	}
	l.open++
	if capped {
		c.addr = key
		a := l.addrs[key]
		if a == nil {
			a = &addrConns{conns: map[*Conn]struct{}{}}
			l.addrs[key] = a
		}
		a.conns[c] = struct{}{}
	}
	l.mu.Unlock()
	l.closeEvicted(evict)
	return c, true
}

// evictLocked takes v out of the candidates; the caller closes it once
// l.mu is released. l.mu held.
func (l *Listener) evictLocked(v *Conn) *Conn {
	l.idle.Remove(v.idleAt)
	v.idleAt = nil
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
	if e := l.idle.Front(); e != nil {
		return e.Value.(*Conn)
	}
	return nil
}

// oldestIdleOf returns a's connection idle the longest, or nil; l.mu held.
func (l *Listener) oldestIdleOf(a *addrConns) *Conn {
	for e := l.idle.Front(); e != nil; e = e.Next() {
		if _, ok := a.conns[e.Value.(*Conn)]; ok {
			return e.Value.(*Conn)
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

// Open returns the connections open now.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Idle returns the connections idle now (between requests).
func (l *Listener) Idle() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.idle.Len()
}

// Close closes the listener; an Accept waiting for a slot returns.
func (l *Listener) Close() error {
	l.mu.Lock()
	l.closed = true
	l.cond.Broadcast()
	l.mu.Unlock()
	return l.inner.Close()
}

// Addr returns the listener's address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }
