package connlimit

import (
	"net"
	"net/http"
	"testing"
	"time"
)

// TestConnStateTakesNoLock: a connection turning idle or busy does not
// wait for the Listener's mutex (held here as a scan near the cap, or an
// accept, holds it), and the idle state it sets is seen once the mutex
// is free. Only a connection waiting for room needs the mutex.
func TestConnStateTakesNoLock(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, Config{MaxConns: 10, MaxPerAddr: 4})
	defer l.Close()
	d, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	nc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	l.ConnState(nc, http.StateNew)
	l.ConnState(nc, http.StateActive)
	l.mu.Lock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.ConnState(nc, http.StateIdle)
		l.ConnState(nc, http.StateActive)
		l.ConnState(nc, http.StateIdle)
	}()
	select {
	case <-done:
		l.mu.Unlock()
	case <-time.After(20 * time.Second): // a hang bound, not a timing
		l.mu.Unlock()
		<-done
		t.Fatal("ConnState waited for the Listener's mutex")
	}
	if n := l.Idle(); n != 1 {
		t.Errorf("%d idle, want 1", n)
	}
}
