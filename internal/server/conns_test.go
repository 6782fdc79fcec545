package server_test

// Connection hoarding: one address, or many idle
// keep-alives, or connections that never finish their headers, cannot
// keep another client from being served. Each client dials from its own
// loopback address (127.0.0.0/8 is all loopback on Linux).

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/server/config"
)

// dialFrom connects to addr from the loopback address from.
func dialFrom(from, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	return d.Dial("tcp", addr)
}

const allowReq = "POST /v1/allow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"key\":\"a\"}"

// keepAlive sends one request on c and reads its answer within d; the
// connection stays open, idle in the server.
func keepAlive(c net.Conn, br *bufio.Reader, d time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(d))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := io.WriteString(c, allowReq); err != nil {
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

// hold opens n connections from the address from, at once; each sends
// one request and stays open (idle) when it is answered within a few
// seconds, or, with slow set, sends half a request line and stops. It
// returns how many were answered (or, slow, how many are open).
func hold(t *testing.T, from, addr string, n int, slow bool) int {
	t.Helper()
	var (
		mu   sync.Mutex
		held int
		wg   sync.WaitGroup
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := dialFrom(from, addr)
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
			if slow {
				if _, err := io.WriteString(c, "POST /v1/allow HTTP/1.1\r\nHost: x\r\n"); err == nil {
					mu.Lock()
					held++
					mu.Unlock()
				}
				return
			}
			if keepAlive(c, bufio.NewReader(c), 5*time.Second) == nil {
				mu.Lock()
				held++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return held
}

// servedWithin reports whether a client from the address from is answered
// within bound, and how long it took.
func servedWithin(from, addr string, bound time.Duration) (time.Duration, error) {
	start := time.Now()
	c, err := dialFrom(from, addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	err = keepAlive(c, bufio.NewReader(c), bound)
	return time.Since(start), err
}

// openConns reads slidegate_open_connections{listener="main"}.
func openConns(t *testing.T, e *env) string {
	t.Helper()
	m := e.do("GET", e.admin+"/metrics", "")
	for _, l := range strings.Split(string(m.body), "\n") {
		if strings.HasPrefix(l, `slidegate_open_connections{listener="main"} `) {
			return strings.TrimPrefix(l, `slidegate_open_connections{listener="main"} `)
		}
	}
	return "?"
}

// TestOneAddressCannotHoldTheListener: with max_conns 20, an address that
// opens 40 keep-alive connections and 20 that never finish their headers
// holds at most half the listener (max_conns_per_ip is lowered to it),
// and another address is served while it does. The product answers it at
// once; the test allows a loaded machine 30 s and logs the time taken.
func TestOneAddressCannotHoldTheListener(t *testing.T) {
	cfg := mustParse(t, "max_conns: 20\npolicies:\n  - {name: free, limit: 100000, window: 60s}\n")
	e := start(t, cfg)
	addr := strings.TrimPrefix(e.base, "http://")
	idle := hold(t, "127.0.0.2", addr, 40, false)
	slow := hold(t, "127.0.0.2", addr, 20, true)
	took, err := servedWithin("127.0.0.3", addr, 30*time.Second)
	if err != nil {
		t.Fatalf("another address while one holds every slot it may: %v (the hog was answered on %d connections)", err, idle)
	}
	open := openConns(t, e)
	t.Logf("the hog was answered on %d of 40 connections (each new one closing its oldest idle one) and wrote %d unfinished requests; another address was served in %v; open connections then: %s",
		idle, slow, took.Round(time.Millisecond), open)
	// The hog's cap (10), and the other client's connection if its close
	// is not yet seen.
	if n, err := strconv.Atoi(open); err != nil || n > 11 {
		t.Errorf("open connections: %s, want at most 11", open)
	}
}

// TestIdleKeepAlivesGiveWay: max_conns idle keep-alive connections from
// four addresses (each within its cap) do not keep a fifth address from
// being served: the oldest idle one is closed for it.
func TestIdleKeepAlivesGiveWay(t *testing.T) {
	cfg := mustParse(t, "max_conns: 20\npolicies:\n  - {name: free, limit: 100000, window: 60s}\n")
	e := start(t, cfg)
	addr := strings.TrimPrefix(e.base, "http://")
	held := 0
	for i := range 4 {
		held += hold(t, fmt.Sprintf("127.0.0.%d", i+2), addr, 5, false)
	}
	for i := range 3 {
		took, err := servedWithin(fmt.Sprintf("127.0.0.%d", i+10), addr, 30*time.Second)
		if err != nil {
			t.Fatalf("client %d after %d idle keep-alives: %v", i+1, held, err)
		}
		t.Logf("client %d after %d idle keep-alives: served in %v", i+1, held, took.Round(time.Millisecond))
	}
	if m := e.do("GET", e.admin+"/metrics", ""); !strings.Contains(string(m.body), `slidegate_connections_closed_total{listener="main",reason="idle_evicted"}`) {
		t.Error("/metrics lacks slidegate_connections_closed_total")
	}
}

// TestSlowHeadersFreeTheirSlots: with max_conns 20, 20 connections from
// two addresses that never finish their headers are closed by the header
// timeout (read_header_timeout, 5 s by default, however long read_timeout
// is), and a new client is served then.
func TestSlowHeadersFreeTheirSlots(t *testing.T) {
	cfg := mustParse(t, "max_conns: 20\nread_timeout: 10m\npolicies:\n  - {name: free, limit: 100000, window: 60s}\n")
	e := start(t, cfg)
	addr := strings.TrimPrefix(e.base, "http://")
	var slow []net.Conn
	for _, from := range []string{"127.0.0.2", "127.0.0.3"} {
		for range 10 {
			c, err := dialFrom(from, addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, "POST /v1/allow HTTP/1.1\r\nHost: x\r\n"); err != nil {
				t.Fatal(err)
			}
			slow = append(slow, c)
		}
	}
	took, err := servedWithin("127.0.0.4", addr, 60*time.Second)
	if err != nil {
		t.Fatalf("a new client with 20 slow-header connections open: %v", err)
	}
	t.Logf("a new client with 20 slow-header connections open: served in %v", took.Round(time.Millisecond))
	_ = slow[0].SetReadDeadline(time.Now().Add(60 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(slow[0]), nil)
	if err == nil {
		resp.Body.Close()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Error("a slow-header connection is still open after 60 s")
	}
	if config.DefaultReadHeaderTimeout >= 10*time.Minute {
		t.Error("the default header timeout is no shorter than read_timeout here")
	}
}
