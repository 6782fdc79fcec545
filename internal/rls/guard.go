package rls

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
)

// MetricRefusedConns counts gRPC connections refused before their first
// call, by reason (RefusedTLSHandshake, RefusedPreface).
const MetricRefusedConns = "slidegate_rls_refused_connections_total"

// Reasons of MetricRefusedConns.
const (
	// RefusedTLSHandshake: the TLS handshake failed (not TLS, no common
	// version or cipher, a bad client certificate, a timeout).
	RefusedTLSHandshake = "tls_handshake"
	// RefusedPreface: the connection did not start with HTTP/2's client
	// preface (HTTP/1, a port scanner, garbage).
	RefusedPreface = "preface"
)

// RefusedLogInterval is the shortest interval between two log lines about
// refused connections; each line counts those refused since the last.
const RefusedLogInterval = 10 * time.Second

// DefaultHandshakeTimeout bounds a new gRPC connection's TLS handshake and
// HTTP/2 preface (grpc.ConnectionTimeout).
const DefaultHandshakeTimeout = 10 * time.Second

// GuardListener wraps a gRPC server's listener (after TLS, when the
// listener is tls.NewListener's). Each connection's TLS handshake and
// HTTP/2 client preface are checked before gRPC reads it. A connection
// that fails either is closed without gRPC seeing it: it is counted in
// MetricRefusedConns (registered on reg when not nil) and logged at most
// once per RefusedLogInterval, without what the client sent. gRPC itself
// would log each one, quoting the client's first bytes.
func GuardListener(lis net.Listener, reg prometheus.Registerer, logger *slog.Logger) net.Listener {
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRefusedConns,
		Help: "gRPC connections refused before their first call, by reason: tls_handshake, preface."}, []string{"reason"})
	if reg != nil {
		if err := reg.Register(refused); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				refused = are.ExistingCollector.(*prometheus.CounterVec)
			}
		}
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &guard{Listener: lis, logger: logger, counts: map[string]int{},
		counters: [2]prometheus.Counter{refused.WithLabelValues(RefusedTLSHandshake), refused.WithLabelValues(RefusedPreface)}}
}

type guard struct {
	net.Listener
	logger   *slog.Logger
	counters [2]prometheus.Counter

	mu     sync.Mutex
	last   time.Time      // of the last log line
	counts map[string]int // refused since it
}

func (g *guard) Accept() (net.Conn, error) {
	c, err := g.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &guardedConn{Conn: c, g: g}, nil
}

// refused counts a connection refused, and logs when the last line is
// older than RefusedLogInterval.
func (g *guard) refused(reason string, remote net.Addr) {
	if reason == RefusedTLSHandshake {
		g.counters[0].Inc()
	} else {
		g.counters[1].Inc()
	}
	g.mu.Lock()
	g.counts[reason]++
	now := time.Now()
	if now.Sub(g.last) < RefusedLogInterval {
		g.mu.Unlock()
		return
	}
	hs, pf := g.counts[RefusedTLSHandshake], g.counts[RefusedPreface]
	clear(g.counts)
	g.last = now
	g.mu.Unlock()
	g.logger.Warn("gRPC connections refused before their first call", RefusedTLSHandshake, hs, RefusedPreface, pf,
		"last_peer", remote.String(), "next_line_after", RefusedLogInterval.String())
}

// guardedConn checks its connection on the first Read or Write: gRPC
// writes its SETTINGS before it reads the client's preface.
type guardedConn struct {
	net.Conn
	g       *guard
	once    sync.Once
	failed  bool   // set in once
	preface []byte // read by the check, handed to the first Reads
}

var clientPreface = []byte(http2.ClientPreface)

func (c *guardedConn) check() {
	if tc, ok := c.Conn.(*tls.Conn); ok {
		if err := tc.Handshake(); err != nil {
			c.fail(RefusedTLSHandshake)
			return
		}
	}
	buf := make([]byte, len(clientPreface))
	n, err := io.ReadFull(c.Conn, buf)
	switch {
	case n == 0 && err == io.EOF:
		// Closed before a byte (a load balancer's TCP check): not counted.
		c.failed = true
		_ = c.Conn.Close()
	case err != nil || !bytes.Equal(buf, clientPreface):
		c.fail(RefusedPreface)
	default:
		c.preface = buf
	}
}

// fail counts the connection refused, then closes it: a client that sees
// it closed finds it counted.
func (c *guardedConn) fail(reason string) {
	c.failed = true
	c.g.refused(reason, c.Conn.RemoteAddr())
	_ = c.Conn.Close()
}

// Read returns io.EOF on a refused connection, which gRPC closes without
// a log line.
func (c *guardedConn) Read(p []byte) (int, error) {
	c.once.Do(c.check)
	if c.failed {
		return 0, io.EOF
	}
	if len(c.preface) > 0 {
		n := copy(p, c.preface)
		c.preface = c.preface[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// Write discards what gRPC writes to a refused connection, so that gRPC
// goes on to its Read and sees io.EOF.
func (c *guardedConn) Write(p []byte) (int, error) {
	c.once.Do(c.check)
	if c.failed {
		return len(p), nil
	}
	return c.Conn.Write(p)
}
