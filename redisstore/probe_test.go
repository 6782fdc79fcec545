package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/clientcore"
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
	if err := pingRaw(ctx, listen(t, reply("+PONG\r\n")), nil, time.Second, grace, time.Second); err != nil {
		t.Errorf("PONG: %v, want an answer", err)
	}
	if err := pingRaw(ctx, listen(t, reply("-NOAUTH Authentication required.\r\n")), nil, time.Second, grace, time.Second); err != nil {
		t.Errorf("NOAUTH: %v, want an answer", err)
	}
	if err := pingRaw(ctx, listen(t, func(c net.Conn) { c.Close() }), nil, time.Second, grace, time.Second); err != nil {
		t.Errorf("a close (a TLS port's answer to plaintext): %v, want an answer", err)
	}
	silent := listen(t, func(net.Conn) {})
	if err := pingRaw(ctx, silent, nil, time.Second, grace, time.Second); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("silent node: %v, want the deadline error", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	if err := pingRaw(ctx, gone, nil, time.Second, grace, time.Second); err == nil {
		t.Error("closed port: no error, want the refused dial")
	}
	cctx, cancel := context.WithCancel(ctx)
	res := make(chan error, 1)
	go func() { res <- pingRaw(cctx, silent, nil, time.Second, time.Hour, time.Hour) }()
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

// TestStarvedHostIsNotAHang stops this test's own process (SIGSTOP from a
// child shell, SIGCONT 1.5 s later) right after a call timed out on a
// stalled Redis, so that Redis answers the liveness probe while nothing
// in this process can read the reply, and the probe's grace ends during
// the stop: a busy host at its worst. The reply waits in the socket, so
// the node answered: under FailLocal the request is refused as slow, the
// breaker (threshold 1) stays closed, and nothing is decided locally.
// Before, the probe's PING went through the pipeline and its deadline
// fired before the reader ran: the node was judged hung, the breaker
// opened, and the local limiter admitted.
func TestStarvedHostIsNotAHang(t *testing.T) {
	srv := ownRedis(t)
	p := engine.Policy{Name: "starved", Limit: 5, Window: time.Minute}
	var stops sync.WaitGroup
	defer stops.Wait()
	stall := func() {
		// The shell stops this process; it cannot stop itself and
		// resume. Its own sleep runs while every thread here is stopped.
		cmd := exec.Command("sh", "-c", fmt.Sprintf("kill -STOP %d; sleep 1.5; kill -CONT %d", os.Getpid(), os.Getpid()))
		if err := cmd.Start(); err != nil {
			t.Errorf("starting the stopper: %v", err)
			return
		}
		stops.Add(1)
		go func() { defer stops.Done(); cmd.Wait() }()
	}
	hook := func(ctx context.Context, _, _, _ string) (context.Context, func(bool, error)) {
		return ctx, func(_ bool, err error) {
			if errors.Is(err, context.DeadlineExceeded) {
				stall()
			}
		}
	}
	l := newTestLimiter(t, "redis://"+srv.addr, p, WithFailurePolicy(FailLocal), WithTimeout(100*time.Millisecond),
		WithBreaker(1, time.Hour), WithRefusalCache(0), WithCallHook(hook),
		WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	ctx := context.Background()
	if _, err := l.Decide(ctx, "warm", 1); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		// Long enough that the stop starts before Redis answers, short
		// enough that Redis answers within the probe's grace (500 ms from
		// the timeout at about 130 ms).
		done := stallRedis(t, srv.addr, "0.5")
		d, err := l.Decide(ctx, "k", 1)
		if err != nil || d.Allowed || !d.Fallback {
			t.Errorf("request %d on a starved host: %+v %v, want refused as slow (Fallback set)", i, d, err)
		}
		<-done
		stops.Wait()
	}
	if got := metricValue(l.st.m.fallbacks.WithLabelValues("local")); got != 0 {
		t.Errorf("%v decisions by the local limiter, want 0: a starved host is not a hung node", got)
	}
	if s := l.st.nodeOf(slotOf("k")).br.State(); s != clientcore.StateClosed {
		t.Errorf("breaker %s after a starved host read the probe's reply late, want closed", s)
	}
	if got := metricValue(l.st.m.slow); got != 3 {
		t.Errorf("slow refusals counted %v, want 3", got)
	}
}

// TestHostStallIsNotAHang stalls the whole host, Redis included: right
// after a call timed out on a stalled Redis, a child shell stops Redis
// and this test's own process (SIGSTOP), resumes this process 1.5 s later
// and Redis 0.3 s after that. The probe's grace (1 s) passes in wall time
// during the stop, and no reply has come when this process wakes, but
// the node is not hung: nothing ran, here or there. The probe counts only
// the time this process was seen running, so it waits on, Redis answers,
// and under FailLocal the request is refused as slow, the breaker
// (threshold 1) stays closed, and nothing is decided locally. Both probes
// are checked: the store's own connection, and a PING through a caller's
// client (OpenClient). Before, the probe judged the node hung once the
// grace had passed in wall time: the breaker opened and the local limiter
// admitted.
func TestHostStallIsNotAHang(t *testing.T) {
	for _, own := range []bool{true, false} {
		name := map[bool]string{true: "own", false: "client"}[own]
		t.Run(name, func(t *testing.T) { hostStall(t, own) })
	}
}

func hostStall(t *testing.T, own bool) {
	srv := ownRedis(t)
	p := engine.Policy{Name: "hoststall", Limit: 5, Window: time.Minute}
	var stops sync.WaitGroup
	defer stops.Wait()
	stall := func() {
		me, rp := os.Getpid(), srv.cmd.Process.Pid
		cmd := exec.Command("sh", "-c", fmt.Sprintf("kill -STOP %d; kill -STOP %d; sleep 1.5; kill -CONT %d; sleep 0.3; kill -CONT %d", rp, me, me, rp))
		if err := cmd.Start(); err != nil {
			t.Errorf("starting the stopper: %v", err)
			return
		}
		stops.Add(1)
		go func() { defer stops.Done(); cmd.Wait() }()
	}
	hook := func(ctx context.Context, _, _, _ string) (context.Context, func(bool, error)) {
		return ctx, func(_ bool, err error) {
			if errors.Is(err, context.DeadlineExceeded) {
				stall()
			}
		}
	}
	// The dial timeout only lifts the probe's bound on its wall time
	// above the stall; the grace stays five timeouts (1 s).
	opts := []Option{WithKeyPrefix(testPrefix(t)), WithFailurePolicy(FailLocal), WithTimeout(200 * time.Millisecond),
		WithDialTimeout(5 * time.Second), WithBreaker(1, time.Hour), WithRefusalCache(0), WithCallHook(hook),
		WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}
	var st *Store
	var err error
	if own {
		st, err = Open("redis://"+srv.addr, opts...)
	} else {
		st, err = OpenClient("rueidis", RueidisClient(rawClient(t, srv.addr)), opts...)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l, err := st.Limiter(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := l.Decide(ctx, "warm", 1); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		// Long enough that the call times out (its deadline follows the
		// probes' round trips up) and the stop starts before Redis answers.
		done := stallRedis(t, srv.addr, "1")
		d, err := l.Decide(ctx, "k", 1)
		if err != nil || d.Allowed || !d.Fallback {
			t.Errorf("request %d during a host stall: %+v %v, want refused as slow (Fallback set)", i, d, err)
		}
		<-done
		stops.Wait()
	}
	if got := metricValue(st.m.fallbacks.WithLabelValues("local")); got != 0 {
		t.Errorf("%v decisions by the local limiter, want 0: a stalled host is not a hung node", got)
	}
	if s := st.nodeOf(slotOf("k")).br.State(); s != clientcore.StateClosed {
		t.Errorf("breaker %s after a host stall, want closed", s)
	}
	if got := metricValue(st.m.slow); got != 3 {
		t.Errorf("slow refusals counted %v, want 3", got)
	}
}

// TestProbeTLS: on a TLS-only server that requires client certificates
// and a password, the store's probe shakes hands with the store's TLS
// settings and takes the NOAUTH reply for an answer; the same server
// stopped (SIGSTOP) is a hang.
func TestProbeTLS(t *testing.T) {
	needRedis(t)
	certs := makeCerts(t, true)
	srv := startRedisTLS(t, false, certs, "--requirepass", "tls-s3cret")
	t.Cleanup(srv.stop)
	p := engine.Policy{Name: "probetls", Limit: 3, Window: time.Minute}
	l := newTestLimiter(t, "rediss://:tls-s3cret@"+srv.addr, p, append(certs.storeOptions(), WithTimeout(100*time.Millisecond))...)
	nd := l.st.nodeOf(0)
	if err := l.st.ping(nd); err != nil {
		t.Fatalf("probe of a TLS server that answers: %v", err)
	}
	srv.signal(syscall.SIGSTOP)
	err := l.st.ping(nd)
	srv.signal(syscall.SIGCONT)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("probe of a stopped TLS server: %v, want the deadline error", err)
	}
}
