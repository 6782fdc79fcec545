package connlimit_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/leakcheck"

	"github.com/slidegate/slidegate/internal/connlimit"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// serve runs an http.Server on a connlimit.Listener over a real loopback
// listener, stopped at the end of the test.
func serve(t *testing.T, cfg connlimit.Config) (*connlimit.Listener, string, *atomic.Int64) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var closed atomic.Int64
	cfg.OnClose = func(string) { closed.Add(1) }
	l := connlimit.New(inner, cfg)
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }),
		ReadHeaderTimeout: time.Minute,
		ConnState:         l.ConnState,
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return l, inner.Addr().String(), &closed
}

// dialFrom opens a connection to addr from the loopback address from
// (127.0.0.0/8 is all loopback on Linux, so each is another client).
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// get sends one keep-alive request on c and reads the answer; the
// connection then sits idle in the server.
func get(c net.Conn, br *bufio.Reader) error {
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return errors.New(resp.Status)
	}
	return nil
}

// closedByPeer reports whether the server closes c within a generous
// bound.
func closedByPeer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// waitOpen polls until l has n connections open.
func waitOpen(t *testing.T, l *connlimit.Listener, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for l.Open() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open, want %d", l.Open(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitIdle polls until l has n connections idle: http.Server reports a
// connection idle only after the client may have read its answer.
func waitIdle(t *testing.T, l *connlimit.Listener, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for l.Idle() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections idle, want %d", l.Idle(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitWaiting polls until l has n connections waiting for their
// address's slot.
func waitWaiting(t *testing.T, l *connlimit.Listener, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for l.Waiting() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections waiting, want %d", l.Waiting(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitReported polls, within a generous bound, until OnClose has been
// called n times: it runs just after the close the client saw.
func waitReported(closed *atomic.Int64, n int64) {
	for deadline := time.Now().Add(20 * time.Second); closed.Load() < n && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPerAddrCap: one address gets at most MaxPerAddr connections, even
// ones that never finish their headers; as many more wait without a
// slot, and one more is closed at once; another address is served
// meanwhile; a waiting one is served when one of its address's closes.
func TestPerAddrCap(t *testing.T) {
	l, addr, closed := serve(t, connlimit.Config{MaxConns: 20, MaxPerAddr: 5})
	var hog []net.Conn
	for range 5 {
		c := dialFrom(t, "127.0.0.2", addr)
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\n") // never finished
		hog = append(hog, c)
	}
	waitOpen(t, l, 5)
	var parked []net.Conn
	for range 5 {
		parked = append(parked, dialFrom(t, "127.0.0.2", addr))
	}
	waitWaiting(t, l, 5)
	over := dialFrom(t, "127.0.0.2", addr)
	if !closedByPeer(over) {
		t.Fatal("an eleventh connection from the hog's address stayed open")
	}
	waitReported(closed, 1)
	if closed.Load() != 1 || l.Open() != 5 {
		t.Errorf("closed %d, open %d; want 1 and 5", closed.Load(), l.Open())
	}
	other := dialFrom(t, "127.0.0.3", addr)
	if err := get(other, bufio.NewReader(other)); err != nil {
		t.Errorf("another address while the hog holds its cap: %v", err)
	}
	_ = hog[0].Close()
	if err := get(parked[0], bufio.NewReader(parked[0])); err != nil {
		t.Errorf("the first waiting connection after one of its address's closed: %v", err)
	}
	// Idle after its answer, it is closed for the next one waiting.
	if !closedByPeer(parked[0]) {
		t.Error("a connection that turned idle with others waiting stayed open")
	}
	waitWaiting(t, l, 3)
	waitOpen(t, l, 6) // the hog's 5 and the other address's idle one
}

// TestWaitingServedWhenOneTurnsIdle: a connection waiting for its
// address's slot is served as soon as one of the address's connections
// turns idle (that one is closed for it).
func TestWaitingServedWhenOneTurnsIdle(t *testing.T) {
	l, addr, _ := serve(t, connlimit.Config{MaxConns: 20, MaxPerAddr: 1})
	first := dialFrom(t, "127.0.0.2", addr)
	_, _ = io.WriteString(first, "GET / HTTP/1.1\r\n") // busy
	waitOpen(t, l, 1)
	second := dialFrom(t, "127.0.0.2", addr)
	waitWaiting(t, l, 1)
	errc := make(chan error, 1)
	go func() { errc <- get(second, bufio.NewReader(second)) }()
	// first finishes its request and turns idle: closed for second.
	br := bufio.NewReader(first)
	_, _ = io.WriteString(first, "Host: x\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := <-errc; err != nil {
		t.Errorf("the waiting connection: %v", err)
	}
	if !closedByPeer(first) {
		t.Error("the connection that turned idle stayed open")
	}
}

// TestPerAddrCapClosesOwnIdleFirst: at its cap, a new connection of an
// address closes that address's oldest idle connection instead of being
// refused.
func TestPerAddrCapClosesOwnIdleFirst(t *testing.T) {
	l, addr, _ := serve(t, connlimit.Config{MaxConns: 20, MaxPerAddr: 2})
	first := dialFrom(t, "127.0.0.2", addr)
	if err := get(first, bufio.NewReader(first)); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, l, 1)
	second := dialFrom(t, "127.0.0.2", addr)
	if err := get(second, bufio.NewReader(second)); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, l, 2)
	third := dialFrom(t, "127.0.0.2", addr)
	if err := get(third, bufio.NewReader(third)); err != nil {
		t.Fatalf("third connection: %v", err)
	}
	if !closedByPeer(first) {
		t.Error("the oldest idle connection stayed open")
	}
	waitOpen(t, l, 2)
}

// TestPerAddrAtMostHalf: MaxPerAddr is lowered to half of MaxConns.
func TestPerAddrAtMostHalf(t *testing.T) {
	l, _, _ := serve(t, connlimit.Config{MaxConns: 20, MaxPerAddr: 100})
	if l.PerAddr() != 10 {
		t.Errorf("PerAddr = %d, want 10", l.PerAddr())
	}
}

// TestIdleClosedFirst: near MaxConns, a new client is served by closing
// the oldest idle keep-alive connection.
func TestIdleClosedFirst(t *testing.T) {
	l, addr, closed := serve(t, connlimit.Config{MaxConns: 4}) // high water: 3
	var conns []net.Conn
	for i := range 3 {
		c := dialFrom(t, "127.0.0."+string(rune('2'+i)), addr)
		if err := get(c, bufio.NewReader(c)); err != nil {
			t.Fatal(err)
		}
		waitIdle(t, l, i+1) // idle in this order
		conns = append(conns, c)
	}
	nc := dialFrom(t, "127.0.0.9", addr)
	if err := get(nc, bufio.NewReader(nc)); err != nil {
		t.Fatalf("a new client near max_conns with idle connections: %v", err)
	}
	if !closedByPeer(conns[0]) {
		t.Error("the oldest idle connection stayed open")
	}
	if waitReported(closed, 1); closed.Load() != 1 {
		t.Errorf("%d evictions reported, want 1", closed.Load())
	}
	waitOpen(t, l, 3)
}

// TestFullWaits: with every slot busy, a new connection waits and is
// served once a slot frees.
func TestFullWaits(t *testing.T) {
	l, addr, _ := serve(t, connlimit.Config{MaxConns: 2})
	a := dialFrom(t, "127.0.0.2", addr)
	_, _ = io.WriteString(a, "GET / HTTP/1.1\r\n")
	b := dialFrom(t, "127.0.0.3", addr)
	_, _ = io.WriteString(b, "GET / HTTP/1.1\r\n")
	waitOpen(t, l, 2)
	c := dialFrom(t, "127.0.0.4", addr)
	errc := make(chan error, 1)
	go func() { errc <- get(c, bufio.NewReader(c)) }()
	_ = a.Close()
	if err := <-errc; err != nil {
		t.Errorf("waiting client after a slot freed: %v", err)
	}
}

// TestCloseWhileWaiting: Close returns an Accept that waits for a slot.
func TestCloseWhileWaiting(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := connlimit.New(inner, connlimit.Config{MaxConns: 1})
	dialFrom(t, "127.0.0.2", inner.Addr().String())
	first, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	dialFrom(t, "127.0.0.3", inner.Addr().String())
	errc := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			_ = c.Close()
		}
		errc <- err
	}()
	for l.Open() != 1 {
		time.Sleep(time.Millisecond)
	}
	_ = l.Close()
	if err := <-errc; err == nil {
		t.Error("Accept after Close returned a connection")
	}
}

// TestExempt: an exempt address (a trusted proxy) is not capped per
// address.
func TestExempt(t *testing.T) {
	proxy := netip.MustParseAddr("127.0.0.2")
	l, addr, closed := serve(t, connlimit.Config{MaxConns: 20, MaxPerAddr: 1, Exempt: func(a netip.Addr) bool { return a == proxy }})
	for range 3 {
		c := dialFrom(t, "127.0.0.2", addr)
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\n")
	}
	waitOpen(t, l, 3)
	if closed.Load() != 0 {
		t.Errorf("%d exempt connections closed", closed.Load())
	}
}

// TestStressKeepAliveEvictions: clients from four addresses, more than
// the listener and their addresses may hold, make keep-alive requests
// through a real http.Server, so that connections turn idle and busy
// while others are evicted for new ones and wait for their address's
// slot. Every request is served in the end (a client whose idle
// connection was closed connects again), and once the clients are gone
// nothing is left open, idle or waiting.
func TestStressKeepAliveEvictions(t *testing.T) {
	for _, procs := range []int{2, 32} {
		t.Run("GOMAXPROCS="+strconv.Itoa(procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			l, addr, closed := serve(t, connlimit.Config{MaxConns: 6, MaxPerAddr: 3})
			const perAddr, requests = 4, 25
			var wg sync.WaitGroup
			for a := range 4 {
				from := "127.0.0." + strconv.Itoa(2+a)
				for range perAddr {
					wg.Go(func() {
						d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
						var c net.Conn
						defer func() {
							if c != nil {
								_ = c.Close()
							}
						}()
						var br *bufio.Reader
						for r := 0; r < requests; r++ {
							for attempt := 0; ; attempt++ {
								if attempt == 100 {
									t.Errorf("%s: request %d not served in 100 attempts", from, r)
									return
								}
								if c == nil {
									var err error
									if c, err = d.Dial("tcp", addr); err != nil {
										continue
									}
									br = bufio.NewReader(c)
								}
								if get(c, br) == nil {
									break
								}
								_ = c.Close() // closed by the server: connect again
								c = nil
							}
						}
					})
				}
			}
			wg.Wait()
			waitOpen(t, l, 0)
			if l.Idle() != 0 || l.Waiting() != 0 {
				t.Errorf("idle %d, waiting %d after the clients left; want 0 and 0", l.Idle(), l.Waiting())
			}
			t.Logf("%d connections closed by the listener", closed.Load())
		})
	}
}
