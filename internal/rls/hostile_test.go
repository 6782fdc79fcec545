package rls_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log/slog"
	"math/big"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/slidegate/slidegate/internal/rls"
)

const shouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// wireCodec sends a request's wire bytes as they are (protobuf-go would
// refuse to marshal a string that is not UTF-8) and decodes answers.
type wireCodec struct{}

func (wireCodec) Marshal(v any) ([]byte, error)   { return v.([]byte), nil }
func (wireCodec) Unmarshal(b []byte, v any) error { return proto.Unmarshal(b, v.(proto.Message)) }
func (wireCodec) Name() string                    { return "proto" }

func (e *env) askRaw(t *testing.T, domain, key, value string) (*rlsv3.RateLimitResponse, error) {
	t.Helper()
	// Marshal with a placeholder of the same length, then put the bytes in.
	ph := strings.Repeat("@", len(value))
	b, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(key, ph)}})
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte(ph), []byte(value), 1)
	resp := &rlsv3.RateLimitResponse{}
	err = e.conn.Invoke(context.Background(), shouldRateLimit, b, resp, grpc.ForceCodec(wireCodec{}))
	return resp, err
}

// A descriptor value that is not UTF-8 (Latin-1 copied from a header) is
// decided like any other, and two such values are two keys.
func TestNotUTF8IsDecided(t *testing.T) {
	e := start(t, pairConfig, envOpts{})
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, ok, over, over} {
		r, err := e.askRaw(t, "api", "ip", "caf\xe9")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if r.OverallCode != want {
			t.Fatalf("request %d: %v, want %v", i, r.OverallCode, want)
		}
	}
	// Other byte strings, some of them what an escape could be confused
	// with, are keys of their own.
	for _, v := range []string{"caf\xe8", "caf\xe9\xe9", "café", "caf\U0010FEE9", "caf\U0010FF00\U0010FEE9", "caf\xf4\x8f\xbb\xa9"[:6]} {
		r, err := e.askRaw(t, "api", "ip", v)
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		if r.OverallCode != ok || r.Statuses[0].LimitRemaining != 2 {
			t.Errorf("%q: %v remaining %d, want OK with 2 (a key of its own)", v, r.OverallCode, r.Statuses[0].LimitRemaining)
		}
	}
	if n := metric(t, e.reg, rls.MetricErrors, "code", rls.CodeMalformed); n != 0 {
		t.Errorf("%v requests counted malformed, want 0", n)
	}
	// A message that is not protobuf is still an error, and counted.
	err := e.conn.Invoke(context.Background(), shouldRateLimit, []byte{0x0a, 0xff}, &rlsv3.RateLimitResponse{}, grpc.ForceCodec(wireCodec{}))
	if status.Code(err) != codes.Internal {
		t.Errorf("truncated message: %v, want Internal", err)
	}
	if n := metric(t, e.reg, rls.MetricErrors, "code", rls.CodeMalformed); n != 1 {
		t.Errorf("%v requests counted malformed, want 1", n)
	}
}

// ValidString is one to one, and leaves ordinary UTF-8 alone.
func TestValidString(t *testing.T) {
	in := []string{"", "a", "café", "caf\xe9", "caf\xe8", "caf\xe9\xe9", "\xff", "\U0010FE00", "\U0010FF00", "\U0010FEFF",
		"\U0010FF00\U0010FEE9", "\xe9", "\xf4\x8f\xbb", "\U0010FEE9", "\U0010FFFF", "x\x00y"}
	seen := map[string]string{}
	for _, s := range in {
		out := rls.ValidString(s)
		if !utf8Valid(out) {
			t.Errorf("ValidString(%q) = %q, not UTF-8", s, out)
		}
		if prev, dup := seen[out]; dup {
			t.Errorf("ValidString(%q) = ValidString(%q) = %q", s, prev, out)
		}
		seen[out] = s
	}
	for _, s := range []string{"", "a", "café", "\U0010FFFF", "日本"} {
		if out := rls.ValidString(s); out != s {
			t.Errorf("ValidString(%q) = %q, want it unchanged", s, out)
		}
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\x00\x01") == s }

// h2conn is a raw HTTP/2 client connection: it sends what a grpc-go
// client would refuse to (a header list past the server's setting).
type h2conn struct {
	c   net.Conn
	fr  *http2.Framer
	buf bytes.Buffer
	enc *hpack.Encoder
}

func dialH2(t *testing.T, addr string) *h2conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	h := &h2conn{c: c, fr: http2.NewFramer(c, c)}
	h.enc = hpack.NewEncoder(&h.buf)
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := h.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return h
}

// headers opens stream id with gRPC's headers and the extra ones, in
// HEADERS and CONTINUATION frames, and sends no DATA.
func (h *h2conn) headers(t *testing.T, id uint32, extra []hpack.HeaderField) {
	t.Helper()
	h.buf.Reset()
	for _, f := range append([]hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: shouldRateLimit}, {Name: ":authority", Value: "rls"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"}}, extra...) {
		if err := h.enc.WriteField(f); err != nil {
			t.Fatal(err)
		}
	}
	block := h.buf.Bytes()
	const chunk = 16 << 10
	first := block[:min(chunk, len(block))]
	block = block[len(first):]
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(block) == 0}); err != nil {
		t.Fatal(err)
	}
	for len(block) > 0 {
		part := block[:min(chunk, len(block))]
		block = block[len(part):]
		if err := h.fr.WriteContinuation(id, len(block) == 0, part); err != nil {
			t.Fatal(err)
		}
	}
}

func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// A call's metadata is bounded: a header list of 3 KiB values referenced
// 2,000 times each by HPACK's table (6 MB decoded, 4 KB on the wire) is
// reset by the transport, its memory is not held, and other clients are
// served.
func TestHeaderListBounded(t *testing.T) {
	e := start(t, pairConfig, envOpts{})
	// Warm the server and the client up, so that the heap below is theirs.
	e.ask(t, "api", 0, desc("user", "warm"))
	before := heapInuse()
	h := dialH2(t, e.addr)
	big := strings.Repeat("b", 3000)
	var extra []hpack.HeaderField
	for range 2000 {
		extra = append(extra, hpack.HeaderField{Name: "x-big", Value: big})
	}
	const calls = 16
	for i := range calls {
		h.headers(t, uint32(2*i+1), extra)
	}
	// A PING after them: once it is answered, the server has read every
	// header block.
	if err := h.fr.WritePing(false, [8]byte{1}); err != nil {
		t.Fatal(err)
	}
	_ = h.c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a hang bound
	reset, pinged := map[uint32]bool{}, false
	read := func(until func() bool) {
		t.Helper()
		for !until() {
			f, err := h.fr.ReadFrame()
			if err != nil {
				t.Fatalf("after %d of %d calls reset: %v", len(reset), calls, err)
			}
			switch f := f.(type) {
			case *http2.RSTStreamFrame:
				reset[f.StreamID] = true
			case *http2.SettingsFrame:
				if !f.IsAck() {
					_ = h.fr.WriteSettingsAck()
				}
			case *http2.PingFrame:
				pinged = pinged || f.IsAck()
			case *http2.GoAwayFrame:
				t.Fatalf("GOAWAY %v after %d calls reset", f.ErrCode, len(reset))
			}
		}
	}
	read(func() bool { return pinged })
	if grew := int64(heapInuse()) - int64(before); grew > 8<<20 {
		t.Errorf("the heap grew by %d MiB for %d oversized calls", grew>>20, calls)
	}
	// Every call is reset (RST_STREAM); none is left waiting for its body.
	read(func() bool { return len(reset) == calls })
	// The connection still serves calls within the bound, and other
	// clients are served.
	h.headers(t, 2*calls+1, []hpack.HeaderField{{Name: "x-small", Value: "1"}})
	e.ask(t, "api", 0, desc("user", "other"))
}

// What one address holds is bounded: streams it keeps open count against
// MaxCallsPerAddr, one more is refused at once; another address is
// served; a unary call whose request never comes ends at the call
// timeout.
func TestCallsPerAddrBounded(t *testing.T) {
	const max = 24
	e := start(t, pairConfig, envOpts{gopts: []grpc.ServerOption{rls.MaxCallsPerAddr(max), rls.CallTimeout(300 * time.Millisecond)}})
	testCallsPerAddr(t, e, max)
}

func testCallsPerAddr(t *testing.T, e *env, max int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hc := healthpb.NewHealthClient(e.conn)
	var watches []context.CancelFunc
	for i := range max {
		wctx, wcancel := context.WithCancel(ctx)
		watches = append(watches, wcancel)
		w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
	}
	// One more call of any kind from this address is refused at once.
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("watch %d: %v, want ResourceExhausted", max+1, err)
	}
	if _, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "a")}}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a call past the cap: %v, want ResourceExhausted", err)
	}
	if n := metric(t, e.reg, rls.MetricErrors, "code", rls.CodeCallsPerAddr); n != 2 {
		t.Errorf("%v calls counted %s, want 2", n, rls.CodeCallsPerAddr)
	}
	// Another address (127.0.0.2) is served.
	other := dialFrom(t, e.addr, "127.0.0.2")
	if _, err := rlsv3.NewRateLimitServiceClient(other).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "b")}}); err != nil {
		t.Fatalf("another address: %v", err)
	}
	// A stream that ends frees its slot.
	watches[0]()
	waitFor(t, func() bool {
		_, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "c")}})
		return err == nil
	})
	for _, c := range watches {
		c()
	}
	// A unary call that sends its headers and never its request ends at
	// the call timeout, and frees its slot.
	// A longer grpc-timeout of the client's does not lift it.
	long, lcancel := context.WithTimeout(ctx, time.Hour)
	defer lcancel()
	for _, sctx := range []context.Context{ctx, long} {
		// The server frees a slot when the stream's context ends, after
		// the client's cancel has returned: until the watches' slots are
		// back, the cap may refuse the call before its timeout is met.
		waitFor(t, func() bool {
			s, err := e.conn.NewStream(sctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, shouldRateLimit)
			if err != nil {
				t.Fatal(err)
			}
			switch err := s.RecvMsg(&rlsv3.RateLimitResponse{}); status.Code(err) {
			case codes.DeadlineExceeded:
				return true
			case codes.ResourceExhausted:
				return false
			default:
				t.Fatalf("stalled call: %v, want DeadlineExceeded", err)
				return false
			}
		})
	}
	// All the slots come back: the address may hold max streams again.
	waitFor(t, func() bool {
		sctx, scancel := context.WithCancel(ctx)
		defer scancel()
		for range max {
			w, err := hc.Watch(sctx, &healthpb.HealthCheckRequest{})
			if err == nil {
				_, err = w.Recv()
			}
			if err != nil {
				return false
			}
		}
		return true
	})
}

func dialFrom(t *testing.T, addr, src string) *grpc.ClientConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitFor polls cond until it holds; 30 s is a hang bound.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 30 s")
		}
	}
}

// selfSigned returns a server certificate for 127.0.0.1 and a pool that
// trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rls"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// Failed TLS handshakes and connections that are not HTTP/2 are counted,
// not logged one line each, and what they sent is never logged; the
// listener still serves gRPC over TLS.
func TestRefusedConnsCountedNotEchoed(t *testing.T) {
	cert, pool := selfSigned(t)
	cfg, err := rls.ParseConfig("test.yaml", []byte(pairConfig))
	if err != nil {
		t.Fatal(err)
	}
	g, err := cfg.NewGroup()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	reg := prometheus.NewRegistry()
	svc, err := rls.New(cfg, g, rls.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	gs, hs := rls.NewGRPCServer(svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlis := tls.NewListener(lis, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}})
	served := make(chan error, 1)
	go func() { served <- gs.Serve(rls.GuardListener(tlis, reg, logger)) }()
	defer func() { hs.Shutdown(); gs.Stop(); <-served }()
	start := time.Now()
	const marker = "MARKER-0123456789-MARKER"
	send := func(c net.Conn, b string) {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // a hang bound
		_, _ = io.WriteString(c, b)
		_, _ = io.Copy(io.Discard, c) // until the server closes it
	}
	const n = 20
	for range n {
		c, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		send(c, "GET /"+marker+" HTTP/1.1\r\nHost: x\r\n\r\n") // not TLS
		tc, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{RootCAs: pool, NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatal(err)
		}
		send(tc, "PRI * HTTP/2.0\r\n\r\n"+marker+"\r\n") // TLS, then not HTTP/2
	}
	for reason, want := range map[string]float64{rls.RefusedTLSHandshake: n, rls.RefusedPreface: n} {
		if got := metric(t, reg, rls.MetricRefusedConns, "reason", reason); got != want {
			t.Errorf("%s: %v refused, want %v", reason, got, want)
		}
	}
	out := logs.String()
	lines := strings.Count(out, "\n")
	if allowed := 1 + int(time.Since(start)/rls.RefusedLogInterval); lines > allowed {
		t.Errorf("%d log lines for %d refused connections, want at most %d:\n%s", lines, 2*n, allowed, out)
	}
	if strings.Contains(out, "MARKER") || strings.Contains(out, "GET") {
		t.Errorf("the log quotes what a client sent:\n%s", out)
	}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(),
		&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "tls")}}); err != nil {
		t.Fatalf("a gRPC client over TLS: %v", err)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
