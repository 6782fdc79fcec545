package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/slidegate/slidegate/internal/clientcore"
)

// A call that misses its deadline says little: Redis may be hung, or it
// may have answered while this host was too busy to read the reply. The
// store tells them apart with a liveness probe of the node (PING, on the
// same connections as the scripts, with a longer deadline). A node that
// answers is slow, not down: its breaker stays closed, and the timed-out
// request, whose script may have run, is refused rather than decided
// locally (see Limiter.decide). A node that does not answer is hung: its
// breaker opens and the failure policy decides.

// probe is one liveness check of a node, shared by every call that timed
// out while it runs.
type probe struct {
	done  chan struct{} // closed when alive is set
	alive bool
}

// probeGrace is how long a probe waits for the node's PING reply, in
// time this process was seen running (clientcore.RunWait): the base
// grace, or eight smoothed round trips when that is longer (a slow Redis
// answers late), at most the dial timeout.
func (s *Store) probeGrace() time.Duration {
	return min(s.cfg.dialTimeout, max(s.probeBase(), 8*time.Duration(s.rtt.Load())))
}

// probeBase is the probe's grace while round trips are short: five call
// deadlines, at least 250 ms (a busy host reads replies late), at most
// the dial timeout. It also bounds a call's deadline.
func (s *Store) probeBase() time.Duration {
	return min(s.cfg.dialTimeout, max(5*s.cfg.timeout, 250*time.Millisecond))
}

// probeLimit bounds a probe's wait in wall time: a grace and a dial
// timeout. A host starved for longer still ends the wait, with a hang.
func (s *Store) probeLimit(grace time.Duration) time.Duration {
	return grace + s.cfg.dialTimeout
}

// probeNode returns nd's running probe, starting one if none runs. The
// probe's goroutine stops on Close (the store's context ends the PING),
// and Close waits for it.
func (s *Store) probeNode(nd *node) *probe {
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	if p := nd.probe; p != nil {
		return p
	}
	p := &probe{done: make(chan struct{})}
	if s.probesClosed {
		close(p.done)
		return p
	}
	nd.probe = p
	nd.answered.Store(false)
	nd.probing.Store(true)
	s.probeWG.Add(1)
	go func() {
		defer s.probeWG.Done()
		err := s.ping(nd)
		nd.probing.Store(false)
		// An error reply is an answer: the server is up. So is any call
		// that succeeded on the node meanwhile.
		alive := err == nil || isServerErr(err) || nd.answered.Load()
		switch {
		case s.ctx.Err() != nil:
			// Closing: the verdict says nothing about the node.
		case alive:
			nd.br.Revive()
		default:
			nd.br.Trip(fmt.Errorf("%w: no reply to PING: %w", errHung, err))
			s.kickHealth()
		}
		s.probeMu.Lock()
		nd.probe = nil
		s.probeMu.Unlock()
		p.alive = alive
		close(p.done)
	}()
	return p
}

// ping is the probe's check of nd: nil when the node answered within
// the probe's grace. On a store that dialed its own connections it asks
// the kernel, not the scheduler (pingRaw); on a caller's client it sends
// PING through the client. Either way the grace counts only the time
// this process was seen running (clientcore.RunWait): a wait that
// overlapped a stall of this host is not evidence of a hang.
func (s *Store) ping(nd *node) error {
	grace := s.probeGrace()
	if rc, ok := s.conn.(*rueidisConn); ok {
		return pingRaw(s.ctx, nd.addr, rc.tls, s.cfg.dialTimeout, grace, s.probeLimit(grace))
	}
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	start := time.Now()
	res := make(chan error, 1)
	go func() {
		_, err := s.conn.do(ctx, nd.addr, "PING")
		res <- err
	}()
	w := clientcore.NewRunWait(start, grace, s.probeLimit(grace))
	for {
		began := time.Now()
		step, ok := w.Step(began)
		if !ok {
			cancel()
			<-res
			return fmt.Errorf("%w (%v of this host's lag not counted)", context.DeadlineExceeded, w.Lag())
		}
		tm := time.NewTimer(step)
		select {
		case err := <-res:
			tm.Stop()
			if err == nil {
				s.observe(time.Since(start) - w.Lag())
			}
			return err
		case <-tm.C:
			w.Woke(began, time.Now(), step)
		}
	}
}

// A PING through the pipeline cannot tell a hung node from a starved
// host. On a busy host the reply arrives in time but waits in the socket
// until the reading goroutine gets a CPU; the deadline fires first. So
// pingRaw dials a connection of its own (TLS when tc is set) and writes
// PING. When its grace has passed without a reply read, it looks into
// the socket without blocking. Bytes or a close there mean the server's
// process answered in time. An empty socket means it did not.
// Connection-level failures (refused, no route, a dial that times out, a
// failed write) mean down. Any reply counts: +PONG, an error reply such
// as NOAUTH, a close, a TLS alert.
func pingRaw(ctx context.Context, addr string, tc *tls.Config, dialTimeout, grace, limit time.Duration) error {
	network := "tcp"
	if strings.HasPrefix(addr, "/") {
		network = "unix"
	}
	d := net.Dialer{Timeout: dialTimeout}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	// Each read waits the grace from the write that asks for the reply,
	// so a host starved before the write cannot shorten it, and counts
	// only the time this process ran, so a host starved after it cannot.
	pc := &probeConn{Conn: c, grace: grace, limit: limit}
	c.SetDeadline(time.Now().Add(dialTimeout))
	// Close ends a running probe at once.
	stop := context.AfterFunc(ctx, pc.end)
	defer stop()
	var rw io.ReadWriter = pc
	if tc != nil {
		cfg := tc.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tcn := tls.Client(pc, cfg)
		if err := tcn.Handshake(); err != nil {
			return rawVerdict(ctx, c, pc.n > 0, err)
		}
		rw = tcn
		pc.armed = false
	}
	if _, err := rw.Write([]byte("PING\r\n")); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	n0 := pc.n
	var b [64]byte
	_, err = rw.Read(b[:])
	if err == nil {
		return nil
	}
	return rawVerdict(ctx, c, pc.n > n0, err)
}

// rawVerdict judges a probe's read that failed with err: read says
// whether some bytes of the reply were read before.
func rawVerdict(ctx context.Context, c net.Conn, read bool, err error) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case !errors.Is(err, os.ErrDeadlineExceeded), read, answered(c):
		// The server's process acted in time: a reply (perhaps a part of
		// one, or one still unread), a close, a reset, a TLS alert.
		return nil
	}
	return err
}

// probeConn is a probe's connection, used by one goroutine: it counts
// the bytes read, and its first write after arming starts a wait of the
// grace in running time (clientcore.RunWait), which each read then
// follows in short steps.
type probeConn struct {
	net.Conn
	grace, limit time.Duration
	armed        bool
	wait         clientcore.RunWait
	n            int

	mu    sync.Mutex
	ended bool // the store is closing: deadlines stay in the past
}

// end makes every pending and later read or write fail at once.
func (p *probeConn) end() {
	p.mu.Lock()
	p.ended = true
	p.Conn.SetDeadline(time.Unix(1, 0))
	p.mu.Unlock()
}

func (p *probeConn) Read(b []byte) (int, error) {
	if !p.armed {
		n, err := p.Conn.Read(b)
		p.n += n
		return n, err
	}
	err := error(os.ErrDeadlineExceeded)
	for {
		began := time.Now()
		step, ok := p.wait.Step(began)
		if !ok {
			return 0, err
		}
		p.mu.Lock()
		if p.ended {
			p.mu.Unlock()
			return 0, err
		}
		p.Conn.SetReadDeadline(began.Add(step))
		p.mu.Unlock()
		var n int
		n, err = p.Conn.Read(b)
		p.n += n
		if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		p.wait.Woke(began, time.Now(), step)
	}
}

func (p *probeConn) Write(b []byte) (int, error) {
	n, err := p.Conn.Write(b)
	if !p.armed && err == nil {
		p.armed = true
		p.wait = clientcore.NewRunWait(time.Now(), p.grace, p.limit)
	}
	return n, err
}

// errHung is the cause of a breaker opened by a failed liveness probe.
var errHung = errors.New("redisstore: node hung")

// stopProbes makes later probes end at once and waits for running ones.
// The store's context is cancelled first, which ends their PING.
func (s *Store) stopProbes() {
	s.probeMu.Lock()
	s.probesClosed = true
	s.probeMu.Unlock()
	s.probeWG.Wait()
}

// probeSet is the state Store keeps for liveness probes.
type probeSet struct {
	probeMu      sync.Mutex
	probesClosed bool
	probeWG      sync.WaitGroup
}

// isTimeout reports whether a failed call ran out of the store's own
// deadline (the caller's context still live).
func isTimeout(ctx context.Context, err error) bool {
	return ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded)
}

// awaitProbe probes nd after a call timed out and waits for the verdict:
// true when the node answered (the host or the node is slow), false when
// it did not (hung) or the store is closing. A caller's context that ends
// first returns its error.
func (s *Store) awaitProbe(ctx context.Context, nd *node) (bool, error) {
	p := s.probeNode(nd)
	select {
	case <-p.done:
		return p.alive, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}
