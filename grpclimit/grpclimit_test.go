package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/grpclimit"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/reference"
)

// service is a real grpc-go test service that counts the calls its
// handlers run.
type service struct {
	testpb.UnimplementedTestServiceServer
	calls atomic.Int64
}

func (s *service) EmptyCall(context.Context, *testpb.Empty) (*testpb.Empty, error) {
	s.calls.Add(1)
	return &testpb.Empty{}, nil
}

func (s *service) StreamingOutputCall(_ *testpb.StreamingOutputCallRequest, st grpc.ServerStreamingServer[testpb.StreamingOutputCallResponse]) error {
	s.calls.Add(1)
	return st.Send(&testpb.StreamingOutputCallResponse{})
}

// recorder is a Backend that records the keys and decisions of the limiter
// it wraps.
type recorder struct {
	engine.Backend
	mu   sync.Mutex
	recs []reference.Record
	fail bool
}

func (r *recorder) Decide(ctx context.Context, key string, n int) (engine.Decision, error) {
	if r.fail {
		return engine.Decision{}, errors.New("dial tcp 10.9.8.7:6379: connection refused")
	}
	d, err := r.Backend.Decide(ctx, key, n)
	if err == nil {
		r.mu.Lock()
		r.recs = append(r.recs, reference.Record{Key: key, Cost: n, At: d.At, Allowed: d.Allowed,
			Remaining: d.Remaining, RetryAfter: int64(d.RetryAfter), Reset: int64(d.Reset)})
		r.mu.Unlock()
	}
	return d, err
}

func (r *recorder) keys() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.recs {
		out = append(out, rec.Key)
	}
	return out
}

type fixture struct {
	client testpb.TestServiceClient
	svc    *service
	rec    *recorder
	clk    *engine.ManualClock
	lim    *engine.Limiter
}

// start serves the test service on loopback behind a Limiter over a
// policy of limit per minute, built with opts after the backend.
func start(t testing.TB, p engine.Policy, manual bool, opts ...grpclimit.Option) *fixture {
	t.Helper()
	f := &fixture{svc: &service{}}
	var eopts []engine.Option
	if manual {
		f.clk = engine.NewManualClock()
		f.clk.Set(time.Hour)
		eopts = append(eopts, engine.WithClock(f.clk))
	}
	lim, err := engine.New(p, eopts...)
	if err != nil {
		t.Fatal(err)
	}
	f.lim = lim
	f.rec = &recorder{Backend: lim}
	gl, err := grpclimit.New(append([]grpclimit.Option{grpclimit.WithBackend(f.rec)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(gl.UnaryServerInterceptor()), grpc.StreamInterceptor(gl.StreamServerInterceptor()))
	testpb.RegisterTestServiceServer(gs, f.svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	f.client = testpb.NewTestServiceClient(conn)
	t.Cleanup(func() {
		_ = conn.Close()
		gs.GracefulStop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		_ = lim.Close()
	})
	return f
}

var twoPerMinute = engine.Policy{Name: "free", Limit: 2, Window: time.Minute}

func TestUnaryRefusal(t *testing.T) {
	f := start(t, twoPerMinute, true)
	for i, want := range []string{`"free";r=1;t=60`, `"free";r=0;t=50`} {
		var hdr metadata.MD
		if _, err := f.client.EmptyCall(context.Background(), &testpb.Empty{}, grpc.Header(&hdr)); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if got := hdr.Get("ratelimit"); len(got) != 1 || got[0] != want {
			t.Fatalf("call %d: ratelimit %q, want %q", i, got, want)
		}
		if got := hdr.Get("ratelimit-policy"); len(got) != 1 || got[0] != `"free";q=2;w=60` {
			t.Fatalf("call %d: ratelimit-policy %q", i, got)
		}
		f.clk.Advance(10 * time.Second)
	}
	f.clk.Advance(500 * time.Millisecond) // at 20.5s: the entry of 0 leaves at 60
	var trl metadata.MD
	_, err := f.client.EmptyCall(context.Background(), &testpb.Empty{}, grpc.Trailer(&trl))
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "retry in 40s") {
		t.Fatalf("third call: %v", err)
	}
	if got := trl.Get("retry-after"); len(got) != 1 || got[0] != "40" {
		t.Fatalf("retry-after %q (trailer %v)", got, trl)
	}
	if got := trl.Get("ratelimit"); len(got) != 1 || got[0] != `"free";r=0;t=40` {
		t.Fatalf("ratelimit %q", got)
	}
	var info *errdetails.RetryInfo
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			info = ri
		}
	}
	if info == nil || info.RetryDelay.AsDuration() != 39500*time.Millisecond {
		t.Fatalf("RetryInfo %v", st.Details())
	}
	if n := f.svc.calls.Load(); n != 2 {
		t.Fatalf("the handler ran %d times, want 2 (never for the refused call)", n)
	}
	// Waiting exactly the RetryInfo delay suffices.
	f.clk.Advance(39500 * time.Millisecond)
	if _, err := f.client.EmptyCall(context.Background(), &testpb.Empty{}); err != nil {
		t.Fatalf("after the wait: %v", err)
	}
}

func TestStreamRefusal(t *testing.T) {
	f := start(t, engine.Policy{Name: "streams", Limit: 1, Window: time.Minute}, true)
	read := func() (metadata.MD, error) {
		s, err := f.client.StreamingOutputCall(context.Background(), &testpb.StreamingOutputCallRequest{})
		if err != nil {
			return nil, err
		}
		for {
			if _, err := s.Recv(); err != nil {
				if err == io.EOF {
					return s.Trailer(), nil
				}
				return s.Trailer(), err
			}
		}
	}
	if _, err := read(); err != nil {
		t.Fatal(err)
	}
	trl, err := read()
	if status.Code(err) != codes.ResourceExhausted || len(trl.Get("retry-after")) != 1 {
		t.Fatalf("second stream: %v, trailer %v", err, trl)
	}
	if n := f.svc.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

// Forwarding metadata is read only from trusted proxies.
func TestPeerKeyTrustedProxies(t *testing.T) {
	fwd := func(kv ...string) context.Context {
		return metadata.NewOutgoingContext(context.Background(), metadata.Pairs(kv...))
	}
	// The test client is 127.0.0.1: untrusted, its metadata is ignored.
	f := start(t, twoPerMinute, true)
	if _, err := f.client.EmptyCall(fwd("x-forwarded-for", "203.0.113.7"), &testpb.Empty{}); err != nil {
		t.Fatal(err)
	}
	// Trusted: the forwarded client is the key.
	trusted := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	g := start(t, twoPerMinute, true, grpclimit.WithKeyFunc(grpclimit.PeerKey(httplimit.ClientIP{TrustedProxies: trusted})))
	for _, ctx := range []context.Context{
		fwd("x-forwarded-for", "203.0.113.7"),
		fwd("x-forwarded-for", "198.51.100.1, 127.0.0.2"),    // read from the right, skipping trusted hops
		fwd("forwarded", `for="[2001:db8:1:2::5]:443"`),      // not the believed key: the proxy itself
		fwd("x-forwarded-for", "2001:db8:1:2::5, 127.0.0.3"), // IPv6 by /64
		context.Background(),                                 // nothing forwarded: the proxy itself
	} {
		if _, err := g.client.EmptyCall(ctx, &testpb.Empty{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := g.client.EmptyCall(fwd("x-forwarded-for", "not-an-address"), &testpb.Empty{})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || strings.Contains(st.Message(), "127.0.0.1") {
		t.Fatalf("garbage forwarded: %v", err)
	}
	// RFC 7239, when ClientIP.Header says so.
	h := start(t, twoPerMinute, true, grpclimit.WithKeyFunc(grpclimit.PeerKey(httplimit.ClientIP{TrustedProxies: trusted, Header: "Forwarded"})))
	for _, ctx := range []context.Context{
		fwd("forwarded", `for="[2001:db8:1:2::5]:443"`),
		fwd("x-forwarded-for", "203.0.113.7"), // not the believed key
	} {
		if _, err := h.client.EmptyCall(ctx, &testpb.Empty{}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := h.rec.keys(), []string{"2001:db8:1:2::/64", "127.0.0.1"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Forwarded keys %q, want %q", got, want)
	}
	want := []string{"127.0.0.1"}
	if got := f.rec.keys(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("untrusted keys %q, want %q", got, want)
	}
	want = []string{"203.0.113.7", "198.51.100.1", "127.0.0.1", "2001:db8:1:2::/64", "127.0.0.1"}
	if got := g.rec.keys(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("trusted keys %q, want %q", got, want)
	}
}

func TestMetadataAndFuncKeys(t *testing.T) {
	f := start(t, twoPerMinute, true, grpclimit.WithKeyFunc(grpclimit.MethodKey(grpclimit.MetadataKey("X-API-Key"))))
	ctx := func(k string) context.Context {
		return metadata.NewOutgoingContext(context.Background(), metadata.Pairs("x-api-key", k))
	}
	for _, k := range []string{"a", "a", "b"} {
		if _, err := f.client.EmptyCall(ctx(k), &testpb.Empty{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.client.EmptyCall(ctx("a"), &testpb.Empty{}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third call of a: %v", err)
	}
	for _, c := range []context.Context{context.Background(), ctx(""), ctx(strings.Repeat("k", httplimit.MaxKeyLen+1))} {
		if _, err := f.client.EmptyCall(c, &testpb.Empty{}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("no usable key: %v", err)
		}
	}
	want := "/grpc.testing.TestService/EmptyCall a"
	if got := f.rec.keys(); len(got) != 4 || got[0] != want || got[2] != "/grpc.testing.TestService/EmptyCall b" {
		t.Fatalf("keys %q", got)
	}
	if n := f.svc.calls.Load(); n != 3 {
		t.Fatalf("handler ran %d times", n)
	}

	// Any function, and a cost.
	g := start(t, engine.Policy{Limit: 5, Window: time.Minute}, true,
		grpclimit.WithKeyFunc(func(context.Context, string) (string, error) { return "everyone", nil }),
		grpclimit.WithCostFunc(func(context.Context, string) (int, error) { return 3, nil }))
	if _, err := g.client.EmptyCall(context.Background(), &testpb.Empty{}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.client.EmptyCall(context.Background(), &testpb.Empty{}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("cost 3 twice in 5: %v", err)
	}
	bad := start(t, engine.Policy{Limit: 5, Window: time.Minute}, true,
		grpclimit.WithCostFunc(func(context.Context, string) (int, error) { return 6, nil }))
	if _, err := bad.client.EmptyCall(context.Background(), &testpb.Empty{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("cost above the limit: %v", err)
	}
}

func TestExemptShadowAndFailure(t *testing.T) {
	f := start(t, engine.Policy{Limit: 1, Window: time.Minute}, true,
		grpclimit.WithExempt(func(m string) bool { return strings.HasSuffix(m, "/EmptyCall") }))
	for range 3 {
		if _, err := f.client.EmptyCall(context.Background(), &testpb.Empty{}); err != nil {
			t.Fatalf("exempt: %v", err)
		}
	}
	if len(f.rec.keys()) != 0 {
		t.Fatalf("exempt calls were decided: %q", f.rec.keys())
	}

	s := start(t, engine.Policy{Limit: 1, Window: time.Minute}, true, grpclimit.WithShadow(true))
	for range 3 {
		var hdr metadata.MD
		if _, err := s.client.EmptyCall(context.Background(), &testpb.Empty{}, grpc.Header(&hdr)); err != nil {
			t.Fatalf("shadow: %v", err)
		}
		if len(hdr.Get("ratelimit")) != 1 {
			t.Fatalf("shadow call without metadata: %v", hdr)
		}
	}
	if recs := s.rec.recs; len(recs) != 3 || recs[0].Allowed == recs[1].Allowed {
		t.Fatalf("shadow decisions %+v", recs)
	}

	b := start(t, twoPerMinute, true)
	b.rec.fail = true
	_, err := b.client.EmptyCall(context.Background(), &testpb.Empty{})
	if st := status.Convert(err); st.Code() != codes.Unavailable || strings.Contains(st.Message(), "10.9.8.7") {
		t.Fatalf("backend failure: %v", err)
	}
	if _, err := grpclimit.New(); !errors.Is(err, grpclimit.ErrInvalidOption) {
		t.Fatalf("New without a backend: %v", err)
	}
}

// Many clients at once through a real server, a tiny window, few keys, a
// sweeper in a tight loop:
// every decision is replayed through the reference, and the handler ran
// exactly for the allowed calls.
func TestParallelReplay(t *testing.T) {
	for _, procs := range []int{2, 8, 32} {
		t.Run(fmt.Sprint("GOMAXPROCS=", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			p := engine.Policy{Limit: 4, Window: 2 * time.Millisecond}
			f := start(t, p, false, grpclimit.WithKeyFunc(grpclimit.MetadataKey("k")))
			const workers, per = 16, 150
			// Background work in a tight loop: sweeps dropping idle keys
			// while calls decide them.
			stopSweep, sweepDone := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(sweepDone)
				for {
					select {
					case <-stopSweep:
						return
					default:
						f.lim.Sweep()
						runtime.Gosched()
					}
				}
			}()
			var wg sync.WaitGroup
			var refused atomic.Int64
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx := metadata.NewOutgoingContext(context.Background(), metadata.Pairs("k", fmt.Sprint("key", w%3)))
					for range per {
						_, err := f.client.EmptyCall(ctx, &testpb.Empty{})
						switch status.Code(err) {
						case codes.OK:
						case codes.ResourceExhausted:
							refused.Add(1)
						default:
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(stopSweep)
			<-sweepDone
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			recs := f.rec.recs
			rep := reference.VerifyLog(p.Limit, int64(p.Window), recs)
			if !rep.OK() {
				t.Fatalf("%+v", rep)
			}
			if rep.Decisions != workers*per || int64(rep.Refused) != refused.Load() || int64(rep.Allowed) != f.svc.calls.Load() {
				t.Fatalf("%d decisions, %d refused (clients saw %d), handler ran %d times for %d allowed",
					rep.Decisions, rep.Refused, refused.Load(), f.svc.calls.Load(), rep.Allowed)
			}
			if rep.Allowed == 0 || rep.Refused == 0 {
				t.Fatalf("one-sided run: %+v", rep)
			}
		})
	}
}
