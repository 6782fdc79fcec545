package connlimit

import (
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeConn is a connection from a chosen address, for admit.
type fakeConn struct {
	net.Conn
	ra net.Addr
}

func (f fakeConn) RemoteAddr() net.Addr { return f.ra }

// noListener stands in for the wrapped listener of a Listener whose
// connections the test admits itself (its accept goroutine never runs).
type noListener struct{ net.Listener }

func (noListener) Close() error { return nil }

// pipeFrom returns a connection whose peer is ip (the other end closed
// by the test's cleanup).
func pipeFrom(t *testing.T, ip string) net.Conn {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	return fakeConn{Conn: a, ra: &net.TCPAddr{IP: net.ParseIP(ip), Port: 1}}
}

// takeReady returns the connections admit made ready, as Accept would.
func takeReady(l *Listener) []*Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.ready
	l.ready = nil
	return r
}

// admitConn admits nc and takes it from the ready connections.
func admitConn(l *Listener, nc net.Conn) *Conn {
	l.admit(nc)
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, c := range l.ready {
		if c.Conn == nc {
			l.ready = append(l.ready[:i], l.ready[i+1:]...)
			return c
		}
	}
	return nil
}

// claimedNow reports whether c's slot is claimed (evicted, closed) or has
// moved on to another connection.
func claimedNow(c *Conn) bool {
	w := c.word.Load()
	return w>>stampBits != c.gen || w&stampMask == stampClaimed
}

// TestOldestIdleOrder: evictions take the idle connections in the order
// they turned idle, skip busy ones, and reuse freed slots.
func TestOldestIdleOrder(t *testing.T) {
	l := New(noListener{}, Config{MaxConns: 1000})
	for i := range 600 {
		l.admit(pipeFrom(t, netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}).String()))
	}
	cs := takeReady(l)
	order := []int{5, 599, 0, 300, 256, 255}
	for _, i := range order {
		l.ConnState(cs[i], http.StateIdle)
		time.Sleep(2 * time.Microsecond) // stamps are in microseconds
	}
	l.ConnState(cs[0], http.StateActive) // busy again: not a candidate
	for _, want := range []int{5, 599, 300, 256, 255} {
		l.mu.Lock()
		v := l.oldestIdle()
		l.mu.Unlock()
		if v != cs[want] {
			t.Fatalf("evicted slot %v, want connection %d", v, want)
		}
		_ = v.Close()
	}
	l.mu.Lock()
	v := l.oldestIdle()
	l.mu.Unlock()
	if v != nil {
		t.Fatalf("evicted %v with none idle", v)
	}
	l.admit(pipeFrom(t, "10.9.9.9"))
	if n := takeReady(l)[0]; n.slot != 255 { // freed last, reused first
		t.Errorf("new connection in slot %d, want 255", n.slot)
	}
	if l.Open() != 596 {
		t.Errorf("open %d, want 596", l.Open())
	}
}

// TestStressIdleClaims races connections turning busy and idle against
// an evictor: a connection is never claimed while busy (between a
// ConnState(Active) that found it unclaimed and its next idle), and
// every claim is of a connection idle at that moment.
func TestStressIdleClaims(t *testing.T) {
	for _, procs := range []int{2, 8, 32} {
		t.Run("GOMAXPROCS="+itoa(procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			const conns, rounds = 64, 1500
			l := New(noListener{}, Config{MaxConns: 4 * conns})
			for i := range conns {
				l.admit(pipeFrom(t, netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}).String()))
			}
			cs := takeReady(l)
			var busy [conns]atomic.Bool
			var stop atomic.Bool
			var claims atomic.Int64
			var wg sync.WaitGroup
			var cur [conns]atomic.Pointer[Conn]
			for i, c := range cs {
				cur[i].Store(c)
				wg.Go(func() {
					for r := range rounds {
						l.ConnState(c, http.StateActive)
						if claimedNow(c) {
							// Evicted: a real server stops serving it, and
							// its client connects again.
							_ = c.Close()
							c = admitConn(l, pipeFrom(t, netip.AddrFrom4([4]byte{10, 1, byte(r), byte(i)}).String()))
							cur[i].Store(c)
							continue
						}
						busy[i].Store(true)
						runtime.Gosched()
						if claimedNow(c) {
							t.Errorf("connection %d claimed while busy", i)
						}
						busy[i].Store(false)
						l.ConnState(c, http.StateIdle)
					}
				})
			}
			evictor := make(chan struct{})
			go func() {
				defer close(evictor)
				for !stop.Load() {
					l.mu.Lock()
					v := l.oldestIdle()
					l.mu.Unlock()
					if v == nil {
						runtime.Gosched()
						continue
					}
					for i := range cur {
						// busy first: read the other way round, the worker
						// could, between the two loads, see v claimed,
						// connect again and turn busy on its new
						// connection. A worker busy at the first load and
						// still on v at the second was busy on v.
						if busy[i].Load() && cur[i].Load() == v {
							t.Errorf("claimed connection %d while it was busy", i)
						}
					}
					claims.Add(1)
					_ = v.Close()
				}
			}()
			wg.Wait()
			stop.Store(true)
			<-evictor
			for i := range cur {
				_ = cur[i].Load().Close()
			}
			if l.Open() != 0 || l.Idle() != 0 {
				t.Errorf("open %d, idle %d at the end; want 0 and 0", l.Open(), l.Idle())
			}
			t.Logf("%d claims", claims.Load())
		})
	}
}

// TestStressWaitingMeetsIdle races a connection of a capped address
// turning idle against a new connection of the address arriving: the
// new one is never left waiting while the old one sits idle (the old one
// is evicted by either side).
func TestStressWaitingMeetsIdle(t *testing.T) {
	for _, procs := range []int{2, 32} {
		t.Run("GOMAXPROCS="+itoa(procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			for i := range 300 {
				l := New(noListener{}, Config{MaxConns: 8, MaxPerAddr: 1})
				l.admit(pipeFrom(t, "10.2.0.1"))
				a := takeReady(l)[0]
				l.ConnState(a, http.StateActive)
				var wg sync.WaitGroup
				wg.Go(func() { l.admit(pipeFrom(t, "10.2.0.1")) })
				wg.Go(func() { l.ConnState(a, http.StateIdle) })
				wg.Wait()
				if l.Waiting() == 1 && l.Idle() == 1 {
					t.Fatalf("round %d: a connection waits while its address's only one is idle", i)
				}
				if !claimedNow(a) {
					t.Fatalf("round %d: the idle connection was not closed for the new one", i)
				}
				if r := takeReady(l); len(r) != 1 || l.Open() != 1 {
					t.Fatalf("round %d: %d ready, %d open; want the new one admitted", i, len(r), l.Open())
				}
				_ = l.Close()
			}
		})
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}
