package connlimit

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// countingConn counts the deadlines set on it.
type countingConn struct {
	net.Conn
	reads, writes int
}

func (c *countingConn) SetReadDeadline(time.Time) error  { c.reads++; return nil }
func (c *countingConn) SetWriteDeadline(time.Time) error { c.writes++; return nil }

// aLongTimeAgo is the deadline net/http sets to abort its background read.
var aLongTimeAgo = time.Unix(1, 0)

// httpRequestDeadlines makes the deadline calls net/http's server makes
// on a keep-alive connection for one request, with the server's default
// timeouts.
func httpRequestDeadlines(c net.Conn) {
	now := time.Now()
	_ = c.SetReadDeadline(now.Add(5 * time.Second))  // header timeout, after the idle wait
	_ = c.SetReadDeadline(now.Add(30 * time.Second)) // whole request
	_ = c.SetReadDeadline(time.Time{})               // background read starts
	_ = c.SetReadDeadline(aLongTimeAgo)              // and is aborted
	_ = c.SetReadDeadline(time.Time{})
	_ = c.SetWriteDeadline(time.Now().Add(60 * time.Second))
	_ = c.SetReadDeadline(time.Now().Add(120 * time.Second)) // idle
}

// TestDeadlinesReachSocketLess: of net/http's seven deadline moves per
// request, only the abort of the background read and its undoing reach
// the socket; every other one pushes a deadline later. Passed through,
// as before lazy deadlines, 6 read and 1 write deadline per request
// reached it.
func TestDeadlinesReachSocketLess(t *testing.T) {
	const requests = 100
	cc := &countingConn{}
	c := &Conn{Conn: cc}
	for range requests {
		httpRequestDeadlines(c)
	}
	// The first request arms each direction once more.
	if cc.reads > 2*requests+2 || cc.writes > 1 {
		t.Fatalf("%d requests set %d read and %d write deadlines on the socket, want at most %d and 1",
			requests, cc.reads, cc.writes, 2*requests+2)
	}
}

// pair is a loopback TCP connection: the server's side in a Conn, and the
// client's.
func pair(t *testing.T) (*Conn, net.Conn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	client, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return &Conn{Conn: server}, client
}

// readResult is one Read's outcome.
type readResult struct {
	n   int
	err error
	at  time.Time
}

func readAsync(c net.Conn) <-chan readResult {
	ch := make(chan readResult, 1)
	go func() {
		var b [8]byte
		n, err := c.Read(b[:])
		ch <- readResult{n, err, time.Now()}
	}()
	return ch
}

func waitRead(t *testing.T, ch <-chan readResult) readResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(20 * time.Second): // a hang bound only
		t.Fatal("Read did not return")
		return readResult{}
	}
}

// TestLaterDeadlineDoesNotFireEarly: a deadline replaced by a later one
// stays on the socket, and fires; the Read goes on to the later one.
func TestLaterDeadlineDoesNotFireEarly(t *testing.T) {
	c, client := pair(t)
	if err := c.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	ch := readAsync(c)
	time.Sleep(100 * time.Millisecond) // past the first deadline
	if _, err := client.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if r := waitRead(t, ch); r.err != nil || r.n != 1 {
		t.Fatalf("Read = %d, %v; want the byte sent after the replaced deadline", r.n, r.err)
	}
}

// TestLaterDeadlineFires: a later deadline kept as wanted still fires,
// and not before it is due.
func TestLaterDeadlineFires(t *testing.T) {
	c, _ := pair(t)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	want := time.Now().Add(80 * time.Millisecond)
	_ = c.SetReadDeadline(want)
	r := waitRead(t, readAsync(c))
	if !errors.Is(r.err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read = %d, %v; want a timeout", r.n, r.err)
	}
	if r.at.Before(want) {
		t.Fatalf("Read timed out %v before its deadline", want.Sub(r.at))
	}
}

// TestEarlierDeadlineFires: a deadline earlier than the socket's reaches
// it at once.
func TestEarlierDeadlineFires(t *testing.T) {
	c, _ := pair(t)
	_ = c.SetReadDeadline(time.Now().Add(time.Hour))
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	if r := waitRead(t, readAsync(c)); !errors.Is(r.err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read = %d, %v; want a timeout", r.n, r.err)
	}
}

// TestAbortWakesBlockedRead: a past deadline set while a Read blocks (how
// net/http aborts its background read) wakes it with a timeout; clearing
// the deadline then lets the next Read wait for data.
func TestAbortWakesBlockedRead(t *testing.T) {
	c, client := pair(t)
	_ = c.SetReadDeadline(time.Now().Add(time.Hour))
	_ = c.SetReadDeadline(time.Time{})
	ch := readAsync(c)
	time.Sleep(20 * time.Millisecond) // let it block (not needed for the outcome)
	_ = c.SetReadDeadline(aLongTimeAgo)
	if r := waitRead(t, ch); !errors.Is(r.err, os.ErrDeadlineExceeded) {
		t.Fatalf("aborted Read = %d, %v; want a timeout", r.n, r.err)
	}
	_ = c.SetReadDeadline(time.Time{})
	ch = readAsync(c)
	if _, err := client.Write([]byte("y")); err != nil {
		t.Fatal(err)
	}
	if r := waitRead(t, ch); r.err != nil || r.n != 1 {
		t.Fatalf("Read after the abort = %d, %v; want the byte", r.n, r.err)
	}
}

// TestWriteDeadlines: a past write deadline fails a Write; a later one
// replacing it lets the Write through.
func TestWriteDeadlines(t *testing.T) {
	c, client := pair(t)
	_ = c.SetWriteDeadline(time.Now().Add(time.Hour))
	_ = c.SetWriteDeadline(aLongTimeAgo)
	if _, err := c.Write([]byte("z")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write past its deadline: %v, want a timeout", err)
	}
	_ = c.SetWriteDeadline(time.Now().Add(time.Hour))
	if n, err := c.Write([]byte("z")); err != nil || n != 1 {
		t.Fatalf("Write = %d, %v", n, err)
	}
	var b [1]byte
	_ = client.SetReadDeadline(time.Now().Add(20 * time.Second)) // a hang bound only
	if _, err := client.Read(b[:]); err != nil || b[0] != 'z' {
		t.Fatalf("client read %q, %v", b[:], err)
	}
}

// countClock makes the deadlines' clock count its reads, until the test
// ends.
func countClock(t *testing.T) *atomic.Int64 {
	t.Helper()
	var reads atomic.Int64
	clockNow = func() time.Time { reads.Add(1); return time.Now() }
	t.Cleanup(func() { clockNow = time.Now })
	return &reads
}

// TestAbortReadsNoClock: net/http's abort of its background read (a
// deadline in 1970), the timeout it causes and its undoing read no
// clock. Before, the abort, the woken Read's retry and the undoing each
// read it: net/http's deadline moves read it twice per request.
func TestAbortReadsNoClock(t *testing.T) {
	reads := countClock(t)
	const requests = 100
	c := &Conn{Conn: &countingConn{}}
	for range requests {
		httpRequestDeadlines(c)
	}
	// The first request arms each direction once.
	if n := reads.Load(); n > 2 {
		t.Errorf("%d requests read the clock %d times, want at most 2", requests, n)
	}

	// The abort wakes a blocked Read, which sees the wanted deadline
	// passed without a clock read.
	sc, _ := pair(t)
	_ = sc.SetReadDeadline(time.Now().Add(time.Hour))
	_ = sc.SetReadDeadline(time.Time{})
	ch := readAsync(sc)
	reads.Store(0)
	_ = sc.SetReadDeadline(aLongTimeAgo)
	if r := waitRead(t, ch); !errors.Is(r.err, os.ErrDeadlineExceeded) {
		t.Fatalf("aborted Read = %d, %v; want a timeout", r.n, r.err)
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("the abort and the Read's timeout read the clock %d times, want 0", n)
	}
}

// TestUndoAbortAfterItsDeadlinePassed: the deadline an abort replaced,
// past by the time the abort is undone, goes back on the socket; a Read
// that wants no deadline still waits for its data.
func TestUndoAbortAfterItsDeadlinePassed(t *testing.T) {
	c, client := pair(t)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_ = c.SetReadDeadline(aLongTimeAgo)
	time.Sleep(60 * time.Millisecond) // the replaced deadline passes
	_ = c.SetReadDeadline(time.Time{})
	ch := readAsync(c)
	time.Sleep(20 * time.Millisecond) // not needed for the outcome
	if _, err := client.Write([]byte("w")); err != nil {
		t.Fatal(err)
	}
	if r := waitRead(t, ch); r.err != nil || r.n != 1 {
		t.Fatalf("Read = %d, %v; want the byte (no deadline wanted)", r.n, r.err)
	}
}
