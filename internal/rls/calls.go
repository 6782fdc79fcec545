package rls

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// Bounds on what one client holds on the gRPC server NewGRPCServer builds.
const (
	// DefaultMaxHeaderListSize bounds a call's decoded header list
	// (grpc.MaxHeaderListSize; grpc-go's own default is 16 MiB). Envoy's
	// request headers are 60 KiB by default, and the metadata it sends
	// the service is far less. A call over it is reset by the transport
	// (RST_STREAM), with no status and no decision: behind Envoy,
	// failure_mode_deny decides whether it passes.
	DefaultMaxHeaderListSize = 64 << 10
	// DefaultMaxCallsPerAddr bounds the calls in flight from one client
	// address (IPv4 address, IPv6 /64 network), streams included. Envoy's
	// default circuit breaker holds at most 1,024 requests in flight to
	// the service per proxy. A call over it is refused at once,
	// ResourceExhausted, before its request is read.
	DefaultMaxCallsPerAddr = 2048
	// DefaultCallTimeout bounds a unary call (ShouldRateLimit,
	// Health/Check), from its headers to its answer; a call whose request
	// has not come by then ends DeadlineExceeded. A shorter grpc-timeout
	// from the client wins. Streams (Health/Watch, reflection) are bounded
	// by DefaultMaxCallsPerAddr instead.
	DefaultCallTimeout = 10 * time.Second
)

// CodeCallsPerAddr labels, in MetricErrors, calls refused because their
// address had DefaultMaxCallsPerAddr (or MaxCallsPerAddr) in flight.
const CodeCallsPerAddr = "calls_per_address"

// MaxCallsPerAddr is a server option of NewGRPCServer: the calls in
// flight one client address may hold (n < 1: no cap).
func MaxCallsPerAddr(n int) grpc.ServerOption {
	return callOption{f: func(c *callLimiter) { c.max = n }}
}

// CallTimeout is a server option of NewGRPCServer: the longest a unary
// call may take (d <= 0: no bound but the client's).
func CallTimeout(d time.Duration) grpc.ServerOption {
	return callOption{f: func(c *callLimiter) { c.timeout = d }}
}

// CallsIPv6Prefix is a server option of NewGRPCServer: IPv6 clients
// share one MaxCallsPerAddr cap per network of this many bits (default
// 64).
func CallsIPv6Prefix(bits int) grpc.ServerOption {
	return callOption{f: func(c *callLimiter) {
		if bits > 0 && bits <= 128 {
			c.v6bits = bits
		}
	}}
}

// callOption configures the server's callLimiter; gRPC itself ignores it.
type callOption struct {
	grpc.EmptyServerOption
	f func(*callLimiter)
}

// callLimiter is the server's tap: it counts the calls in flight per
// client address and gives unary calls a deadline.
type callLimiter struct {
	max     int
	timeout time.Duration
	v6bits  int
	unary   map[string]bool // full method names of unary methods
	count   func(code string)

	mu     sync.Mutex
	byAddr map[netip.Addr]int
}

func newCallLimiter(count func(string)) *callLimiter {
	return &callLimiter{max: DefaultMaxCallsPerAddr, timeout: DefaultCallTimeout, v6bits: 64, count: count,
		unary: map[string]bool{}, byAddr: map[netip.Addr]int{}}
}

// learn records which of gs's methods are unary; call it before serving.
func (c *callLimiter) learn(gs *grpc.Server) {
	for svc, info := range gs.GetServiceInfo() {
		for _, m := range info.Methods {
			if !m.IsClientStream && !m.IsServerStream {
				c.unary["/"+svc+"/"+m.Name] = true
			}
		}
	}
}

// key returns the address a call counts against, and false when its
// peer has no IP address (a unix socket, a test's pipe).
func (c *callLimiter) key(ctx context.Context) (netip.Addr, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.Addr{}, false
	}
	var a netip.Addr
	if ta, ok := p.Addr.(*net.TCPAddr); ok {
		a = ta.AddrPort().Addr()
	} else if ap, err := netip.ParseAddrPort(p.Addr.String()); err == nil {
		a = ap.Addr()
	} else {
		return netip.Addr{}, false
	}
	a = a.Unmap().WithZone("")
	if a.Is6() {
		pfx, _ := a.Prefix(c.v6bits)
		a = pfx.Addr()
	}
	return a, true
}

// tap runs for each new call, before gRPC creates its stream, with the
// transport's lock held: it must not block.
func (c *callLimiter) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	var a netip.Addr
	counted := false
	if c.max > 0 {
		if a, counted = c.key(ctx); counted {
			c.mu.Lock()
			n := c.byAddr[a]
			if n >= c.max {
				c.mu.Unlock()
				c.count(CodeCallsPerAddr)
				return nil, status.Error(codes.ResourceExhausted, "too many calls in flight from this address")
			}
			c.byAddr[a] = n + 1
			c.mu.Unlock()
		}
	}
	out, cancel := ctx, context.CancelFunc(nil)
	if c.timeout > 0 && c.unary[info.FullMethodName] {
		// Envoy sends its own grpc-timeout (the filter's timeout, 20 ms by
		// default): a call that has a shorter one needs no timer more.
		if d, ok := ctx.Deadline(); !ok || time.Until(d) > c.timeout {
			out, cancel = context.WithTimeout(ctx, c.timeout)
		}
	}
	if counted || cancel != nil {
		// The stream's context ends when the call does, whatever ends it
		// (an answer, a reset, the connection closing).
		context.AfterFunc(ctx, func() {
			if counted {
				c.release(a)
			}
			if cancel != nil {
				cancel()
			}
		})
	}
	return out, nil
}

func (c *callLimiter) release(a netip.Addr) {
	c.mu.Lock()
	if n := c.byAddr[a] - 1; n > 0 {
		c.byAddr[a] = n
	} else {
		delete(c.byAddr, a)
	}
	c.mu.Unlock()
}
