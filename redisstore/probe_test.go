package redisstore

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// listen returns a loopback listener whose accepted connections are
// handed to serve in their own goroutine; Cleanup closes it all.
func listen(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var conns []net.Conn
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			go serve(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// TestAnsweredPeeks: a reply or a close waiting unread in the socket is an
// answer, found without blocking although the read deadline has passed
// (what a starved host sees after the probe's grace); an empty socket is
// not.
func TestAnsweredPeeks(t *testing.T) {
	for _, tc := range []struct {
		name string
		peer func(net.Conn)
		want bool
	}{
		{"reply", func(c net.Conn) { c.Write([]byte("+PONG\r\n")) }, true},
		{"close", func(c net.Conn) { c.Close() }, true},
		{"silent", func(net.Conn) {}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			tc.peer(s)
			// Wait (as a starved host would) until what the peer sent has
			// surely arrived, then find the read deadline passed.
			time.Sleep(50 * time.Millisecond)
			c.SetReadDeadline(time.Now().Add(-time.Second))
			var b [8]byte
			if _, err := c.Read(b[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read past the deadline: %v, want the deadline error", err)
			}
			if got := answered(c); got != tc.want {
				t.Errorf("answered = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPingRaw: the probe's own connection tells a node that answers (a
// reply, an error reply, a close) from one that is up but silent (a
// stopped process: the kernel accepts, nobody reads) or gone (refused);
// the store's closing ends a probe at once.
func TestPingRaw(t *testing.T) {
	ctx := context.Background()
	const grace = 100 * time.Millisecond
	reply := func(s string) func(net.Conn) {
		return func(c net.Conn) {
			var b [64]byte
			if _, err := c.Read(b[:]); err == nil {
				c.Write([]byte(s))
			}
		}
	}
	if err := pingRaw(ctx, listen(t, reply("+PONG\r\n")), time.Second, grace); err != nil {
		t.Errorf("PONG: %v, want an answer", err)
	}
	if err := pingRaw(ctx, listen(t, reply("-NOAUTH Authentication required.\r\n")), time.Second, grace); err != nil {
		t.Errorf("NOAUTH: %v, want an answer", err)
	}
	if err := pingRaw(ctx, listen(t, func(c net.Conn) { c.Close() }), time.Second, grace); err != nil {
		t.Errorf("a close (a TLS port's answer to plaintext): %v, want an answer", err)
	}
	silent := listen(t, func(net.Conn) {})
	if err := pingRaw(ctx, silent, time.Second, grace); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("silent node: %v, want the deadline error", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	if err := pingRaw(ctx, gone, time.Second, grace); err == nil {
		t.Error("closed port: no error, want the refused dial")
	}
	cctx, cancel := context.WithCancel(ctx)
	res := make(chan error, 1)
	go func() { res <- pingRaw(cctx, silent, time.Second, time.Hour) }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-res:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled probe: %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a cancelled probe did not end")
	}
}
