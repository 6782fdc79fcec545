package rls_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidegate/slidegate/engine"
	mn "github.com/slidegate/slidegate/internal/metricnames"
	"github.com/slidegate/slidegate/internal/rls"
)

// env is a service behind a real gRPC listener on loopback, and a client
// made with the generated stubs.
type env struct {
	client rlsv3.RateLimitServiceClient
	conn   *grpc.ClientConn
	gs     *grpc.Server
	clk    *engine.ManualClock
	group  *engine.Group
	reg    *prometheus.Registry
	cfg    *rls.Config
	addr   string // the gRPC listener's
}

type envOpts struct {
	// backend, when set, decides instead of an in-memory group of the
	// configuration (e.group is then nil).
	backend engine.GroupBackend
	wrap    func(engine.GroupBackend) engine.GroupBackend
	real    bool // the monotonic clock instead of a manual one
	opts    []rls.Option
	gopts   []grpc.ServerOption // for rls.NewGRPCServer
}

func start(t testing.TB, yaml string, eo envOpts) *env {
	t.Helper()
	cfg, err := rls.ParseConfig("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{cfg: cfg, reg: prometheus.NewRegistry()}
	var gopts []engine.Option
	if !eo.real {
		e.clk = engine.NewManualClock()
		e.clk.Set(time.Hour) // far from the epoch, so windows start full
		gopts = append(gopts, engine.WithClock(e.clk))
	}
	var b engine.GroupBackend = eo.backend
	if b == nil {
		if e.group, err = cfg.NewGroup(gopts...); err != nil {
			t.Fatal(err)
		}
		b = e.group
	}
	if eo.wrap != nil {
		b = eo.wrap(b)
	}
	opts := append([]rls.Option{rls.WithRegisterer(e.reg)}, eo.opts...)
	svc, err := rls.New(cfg, b, opts...)
	if err != nil {
		t.Fatal(err)
	}
	gs, hs := rls.NewGRPCServer(svc, eo.gopts...)
	e.gs = gs
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = lis.Addr().String()
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	e.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	e.client = rlsv3.NewRateLimitServiceClient(e.conn)
	t.Cleanup(func() {
		_ = e.conn.Close()
		hs.Shutdown()
		gs.GracefulStop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if e.group != nil {
			_ = e.group.Close()
		}
	})
	return e
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (e *env) ask(t testing.TB, domain string, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := e.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.Statuses) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}

const precedenceConfig = `
domain: t
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5, name: k_any}
  - key: k
    value: special
    rate_limit: {unit: minute, requests_per_unit: 1, name: k_special}
  - key: k
    value: "pre*"
    rate_limit: {unit: minute, requests_per_unit: 2, name: k_prefix}
  - key: k
    value: open
    rate_limit: {unlimited: true}
  - key: a
    value: x
    rate_limit: {unit: hour, requests_per_unit: 3, name: a_x}
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 4, name: a_x_b}
      - key: b
        value: y
        rate_limit: {unit: second, requests_per_unit: 6, name: a_x_b_y}
  - key: nolimit
    descriptors:
      - key: c
        rate_limit: {unit: day, requests_per_unit: 7, name: nolimit_c, unit_multiplier: 3}
`

// Which rule a descriptor selects: a descriptor with the request's value
// beats a wildcard, which beats one without a value; each entry descends
// one level; the rule is the last entry's.
func TestPrecedence(t *testing.T) {
	e := start(t, precedenceConfig, envOpts{})
	for _, c := range []struct {
		entries []string
		want    string // rule name; "" for no limit
		limit   uint32
		unit    rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{[]string{"k", "foo"}, "k_any", 5, rlsv3.RateLimitResponse_RateLimit_MINUTE},         // no value in the config: any value
		{[]string{"k", "special"}, "k_special", 1, rlsv3.RateLimitResponse_RateLimit_MINUTE}, // the value beats no value
		{[]string{"k", "prefix1"}, "k_prefix", 2, rlsv3.RateLimitResponse_RateLimit_MINUTE},  // a wildcard beats no value
		{[]string{"k", "pre"}, "k_prefix", 2, rlsv3.RateLimitResponse_RateLimit_MINUTE},      // the prefix alone matches
		{[]string{"k", "pr"}, "k_any", 5, rlsv3.RateLimitResponse_RateLimit_MINUTE},          // short of the prefix
		{[]string{"k", ""}, "k_any", 5, rlsv3.RateLimitResponse_RateLimit_MINUTE},            // an empty value
		{[]string{"k", "open"}, "", 0, 0},                                                    // unlimited: no limit shown
		{[]string{"a", "x"}, "a_x", 3, rlsv3.RateLimitResponse_RateLimit_HOUR},               // a rule with nested ones
		{[]string{"a", "x", "b", "z"}, "a_x_b", 4, rlsv3.RateLimitResponse_RateLimit_SECOND}, // nested, no value
		{[]string{"a", "x", "b", "y"}, "a_x_b_y", 6, rlsv3.RateLimitResponse_RateLimit_SECOND},
		{[]string{"a", "z"}, "", 0, 0},                     // no such value, no default
		{[]string{"a", "x", "b", "y", "c", "1"}, "", 0, 0}, // deeper than the configuration
		{[]string{"nolimit", "1"}, "", 0, 0},               // a level without a rate_limit
		{[]string{"nolimit", "1", "c", "2"}, "nolimit_c", 7, rlsv3.RateLimitResponse_RateLimit_DAY},
		{[]string{"other", "1"}, "", 0, 0},         // unknown key
		{[]string{"k", "foo", "b", "1"}, "", 0, 0}, // k has no nested descriptors
		{[]string{"b", "y"}, "", 0, 0},             // nested keys do not match at the top
	} {
		resp := e.ask(t, "t", 0, desc(c.entries...))
		st := resp.Statuses[0]
		if st.Code != rlsv3.RateLimitResponse_OK || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Errorf("%q: code %v / %v", c.entries, st.Code, resp.OverallCode)
		}
		cl := st.CurrentLimit
		if c.want == "" {
			if cl != nil {
				t.Errorf("%q: limit %v, want none", c.entries, cl)
			}
			continue
		}
		if cl == nil || cl.Name != c.want || cl.RequestsPerUnit != c.limit || cl.Unit != c.unit {
			t.Errorf("%q: limit %v, want %s (%d per %v)", c.entries, cl, c.want, c.limit, c.unit)
		}
		if c.want == "nolimit_c" && cl.GetUnitMultiplier().GetValue() != 3 {
			t.Errorf("unit_multiplier %v, want 3", cl.GetUnitMultiplier())
		}
	}
}

const pairConfig = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: open
    rate_limit: {unlimited: true}
`

// The descriptors of one request are decided together: a refusal by one
// limit charges no other.
func TestAllOrNothing(t *testing.T) {
	e := start(t, pairConfig, envOpts{})
	type want struct {
		code         rlsv3.RateLimitResponse_Code
		user, ip     rlsv3.RateLimitResponse_Code
		userR, ipR   uint32
		userT, ipT   time.Duration
		advanceAfter time.Duration
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for i, w := range []want{
		{ok, ok, ok, 1, 2, time.Minute, time.Minute, 10 * time.Second},          // at 0
		{ok, ok, ok, 0, 1, 50 * time.Second, 50 * time.Second, 5 * time.Second}, // at 10s
		// at 15s: the user limit is full; the ip limit had room but is not
		// charged (remaining stays 1); the wait is until the entry of 0
		// leaves the user's window.
		{over, over, ok, 0, 1, 45 * time.Second, 45 * time.Second, 45 * time.Second},
		// at 60s: the entry of 0 has left both windows (exactly W ago).
		{ok, ok, ok, 0, 1, 10 * time.Second, 10 * time.Second, 0},
	} {
		resp := e.ask(t, "api", 0, desc("user", "u1"), desc("ip", "10.0.0.1"), desc("open", "x"))
		u, p := resp.Statuses[0], resp.Statuses[1]
		if resp.OverallCode != w.code || u.Code != w.user || p.Code != w.ip ||
			u.LimitRemaining != w.userR || p.LimitRemaining != w.ipR ||
			u.DurationUntilReset.AsDuration() != w.userT || p.DurationUntilReset.AsDuration() != w.ipT {
			t.Fatalf("step %d: %v, want %+v", i, resp, w)
		}
		if o := resp.Statuses[2]; o.Code != ok || o.CurrentLimit != nil {
			t.Fatalf("step %d: unlimited status %v", i, o)
		}
		e.clk.Advance(w.advanceAfter)
	}
	// Another user from the same address finds the ip limit where the
	// refused request left it.
	resp := e.ask(t, "api", 0, desc("user", "u2"), desc("ip", "10.0.0.1"))
	if resp.OverallCode != ok || resp.Statuses[1].LimitRemaining != 0 {
		t.Fatalf("u2: %v", resp)
	}
	// A repeated descriptor counts once.
	resp = e.ask(t, "api", 0, desc("user", "u3"), desc("user", "u3"))
	if resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 1 || resp.Statuses[1].LimitRemaining != 1 {
		t.Fatalf("repeated descriptor: %v", resp)
	}
}

const shadowConfig = `
domain: s
descriptors:
  - key: enforced
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: watched
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// Shadow limits decide and count but always answer OK; they are charged
// only for requests the enforced limits let through.
func TestShadow(t *testing.T) {
	e := start(t, shadowConfig, envOpts{})
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	ask := func() *rlsv3.RateLimitResponse {
		return e.ask(t, "s", 0, desc("enforced", "e"), desc("watched", "w"))
	}
	shadowCount := func() float64 { return metric(t, e.reg, rls.MetricShadow, "descriptor", "watched") }

	r := ask() // both fit
	if r.OverallCode != ok || r.Statuses[1].Code != ok || r.Statuses[1].LimitRemaining != 0 || shadowCount() != 0 {
		t.Fatalf("1: %v", r)
	}
	r = ask() // enforced fits; the shadow limit would refuse: OK, counted
	if r.OverallCode != ok || r.Statuses[0].LimitRemaining != 0 || r.Statuses[1].Code != ok || shadowCount() != 1 {
		t.Fatalf("2: %v (shadow count %v)", r, shadowCount())
	}
	r = ask() // enforced refuses: the shadow limit is not charged, its state shown
	if r.OverallCode != over || r.Statuses[0].Code != over || r.Statuses[1].Code != ok ||
		r.Statuses[1].DurationUntilReset == nil || r.Statuses[1].LimitRemaining != 0 || r.Statuses[1].CurrentLimit.GetRequestsPerUnit() != 1 || shadowCount() != 1 {
		t.Fatalf("3: %v (shadow count %v)", r, shadowCount())
	}
	// Shadow alone: never refuses.
	for i := 0; i < 3; i++ {
		r = e.ask(t, "s", 0, desc("watched", "w2"))
		if r.OverallCode != ok || r.Statuses[0].Code != ok {
			t.Fatalf("shadow alone %d: %v", i, r)
		}
	}
	if shadowCount() != 3 || metric(t, e.reg, rls.MetricOverLimit, "descriptor", "watched") != 0 {
		t.Fatalf("shadow count %v", shadowCount())
	}
}

const costConfig = `
domain: c
descriptors:
  - key: bytes
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 3}
`

// Descriptors of different costs are each charged their own cost on any
// backend, a wrapper of the engine's group included: the cost per ref is
// part of the one group interface, not a capability the service probes.
func TestOwnCostsThroughAWrapper(t *testing.T) {
	e := start(t, pairConfig, envOpts{wrap: func(b engine.GroupBackend) engine.GroupBackend { return passThrough{b} }})
	user, ip := desc("user", "u"), desc("ip", "i")
	ip.HitsAddend = wrapperspb.UInt64(3)
	r := e.ask(t, "api", 1, user, ip)
	if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 1 || r.Statuses[1].LimitRemaining != 0 {
		t.Fatalf("user at cost 1 (limit 2), ip at cost 3 (limit 3): %v", r)
	}
	// The user limit was charged 1, not 3: one more fits.
	if r := e.ask(t, "api", 1, desc("user", "u")); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("user's second request: %v", r)
	}
}

// passThrough is a GroupBackend that shows nothing of the backend it
// wraps beyond the interface.
type passThrough struct{ engine.GroupBackend }

// hits_addend is the cost (0 means 1); a cost no limit can admit is
// refused and charges nothing.
func TestHitsAddend(t *testing.T) {
	e := start(t, costConfig, envOpts{})
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for i, c := range []struct {
		hits uint32
		code rlsv3.RateLimitResponse_Code
		rem  uint32
	}{
		{0, ok, 9},    // 0 means 1
		{1, ok, 8},    // 1
		{4, ok, 4},    // 4
		{5, over, 0},  // does not fit: nothing charged (OVER_LIMIT reports 0 left, as envoyproxy/ratelimit)
		{11, over, 0}, // above the limit: never fits, the backend is not asked
		{4, ok, 0},
	} {
		r := e.ask(t, "c", c.hits, desc("bytes", "b"))
		if r.OverallCode != c.code || r.Statuses[0].LimitRemaining != c.rem {
			t.Fatalf("step %d (hits %d): %v", i, c.hits, r)
		}
	}
	// A descriptor's own hits_addend overrides the request's.
	d := desc("bytes", "b2")
	d.HitsAddend = wrapperspb.UInt64(7)
	if r := e.ask(t, "c", 2, d); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 3 {
		t.Fatalf("descriptor hits_addend: %v", r)
	}
	// A limit of 0 refuses everything, and stops the other descriptors of
	// the request from being charged.
	r := e.ask(t, "c", 0, desc("bytes", "b3"), desc("zero", "z"))
	if r.OverallCode != over || r.Statuses[1].Code != over {
		t.Fatalf("zero limit: %v", r)
	}
	// A cost above one limit of the request (small: 3) refuses the request.
	r = e.ask(t, "c", 5, desc("bytes", "b3"), desc("small", "s"))
	if r.OverallCode != over || r.Statuses[1].Code != over || r.Statuses[0].Code != ok {
		t.Fatalf("cost above one limit: %v", r)
	}
	if r := e.ask(t, "c", 0, desc("bytes", "b3")); r.Statuses[0].LimitRemaining != 9 {
		t.Fatalf("b3 was charged by refused requests: %v", r)
	}
}

// What a client can influence gets a decision, never an error (Envoy lets
// a request through on any error): long values, many descriptors and
// entries, huge costs, different costs, overrides, negative hits. Only a
// message no Envoy sends (no domain, no descriptors, too large for gRPC)
// is an error, counted.
func TestClientInputIsDecided(t *testing.T) {
	e := start(t, pairConfig, envOpts{})
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	long := strings.Repeat("v", 1100)
	// The long value is limited like a short one: 3, then refused.
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, ok, over} {
		if r := e.ask(t, "api", 0, desc("ip", long)); r.OverallCode != want {
			t.Fatalf("long value, request %d: %v", i, r)
		}
	}
	// Another long value with the same digest-free prefix is its own key.
	if r := e.ask(t, "api", 0, desc("ip", long+"x")); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("second long value: %v", r)
	}
	// 65 descriptors: decided, the repeated one counted once.
	var many []*ratelimitv3.RateLimitDescriptor
	for range 65 {
		many = append(many, desc("user", "many"))
	}
	if r := e.ask(t, "api", 0, many...); r.OverallCode != ok || r.Statuses[64].LimitRemaining != 1 {
		t.Fatalf("65 descriptors: %v", r.Statuses[64])
	}
	// A cost above the limit is refused, and charges nothing.
	if r := e.ask(t, "api", 2_000_000_000, desc("user", "huge")); r.OverallCode != over {
		t.Fatalf("huge hits_addend: %v", r)
	}
	if r := e.ask(t, "api", 0, desc("user", "huge")); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("after huge hits_addend: %v", r)
	}
	// Seventeen entries: no rule is that deep, so no limit.
	deep := desc("user", "d")
	for range 16 {
		deep.Entries = append(deep.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	if r := e.ask(t, "api", 0, deep); r.OverallCode != ok || r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("deep descriptor: %v", r)
	}
	// An empty descriptor and an empty key match nothing, beside a limit.
	if r := e.ask(t, "api", 0, desc(), desc("", "v"), desc("user", "e")); r.OverallCode != ok || r.Statuses[2].LimitRemaining != 1 {
		t.Fatalf("empty descriptor: %v", r)
	}
	// An unknown domain is OK, no limit.
	if r := e.ask(t, "nope", 0, desc("user", "e")); r.OverallCode != ok || r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("unknown domain: %v", r)
	}
	// is_negative_hits is not in envoyproxy/ratelimit's protocol: charged
	// as an ordinary request.
	neg := desc("user", "neg")
	neg.IsNegativeHits = true
	if r := e.ask(t, "api", 0, neg); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("is_negative_hits: %v", r)
	}
	for _, c := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		code codes.Code
		msg  string
	}{
		{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "x")}}, codes.InvalidArgument, "empty domain"},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "api"}, codes.InvalidArgument, "no descriptors"},
		{"oversized message", &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 1}, codes.ResourceExhausted, ""},
	} {
		if c.name == "oversized message" {
			for i := 0; i < 3000; i++ {
				c.req.Descriptors = append(c.req.Descriptors, desc("ip", strings.Repeat("v", 1000)))
			}
		}
		_, err := e.client.ShouldRateLimit(context.Background(), c.req)
		st, _ := status.FromError(err)
		if st.Code() != c.code || !strings.Contains(st.Message(), c.msg) {
			t.Errorf("%s: %v, want %v containing %q", c.name, err, c.code, c.msg)
		}
	}
	if n := metric(t, e.reg, rls.MetricErrors, "code", "InvalidArgument"); n != 2 {
		t.Errorf("%v InvalidArgument errors counted, want 2", n)
	}
	// gRPC may count the oversized call just after answering it.
	for deadline := time.Now().Add(10 * time.Second); metric(t, e.reg, rls.MetricErrors, "code", "ResourceExhausted") != 1; {
		if time.Now().After(deadline) {
			t.Fatalf("%v oversized messages counted, want 1", metric(t, e.reg, rls.MetricErrors, "code", "ResourceExhausted"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Each descriptor is charged its own hits_addend, all or nothing; 0 checks
// without charging.
func TestPerDescriptorCosts(t *testing.T) {
	e := start(t, pairConfig, envOpts{})
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	withCost := func(d *ratelimitv3.RateLimitDescriptor, n uint64) *ratelimitv3.RateLimitDescriptor {
		d.HitsAddend = wrapperspb.UInt64(n)
		return d
	}
	// user (2) at 1, ip (3) at 2.
	r := e.ask(t, "api", 0, withCost(desc("user", "u"), 1), withCost(desc("ip", "i"), 2))
	if r.OverallCode != ok || r.Statuses[0].LimitRemaining != 1 || r.Statuses[1].LimitRemaining != 1 {
		t.Fatalf("two costs: %v", r)
	}
	// ip at 2 no longer fits: refused, and user is not charged.
	r = e.ask(t, "api", 0, withCost(desc("user", "u"), 1), withCost(desc("ip", "i"), 2))
	if r.OverallCode != over || r.Statuses[0].Code != ok || r.Statuses[0].LimitRemaining != 1 || r.Statuses[1].Code != over {
		t.Fatalf("second: %v", r)
	}
	// Checks: 0 charges nothing, reports the state, and is never refused.
	for range 2 {
		r = e.ask(t, "api", 0, withCost(desc("user", "u"), 0), withCost(desc("ip", "i"), 0))
		if r.OverallCode != ok || r.Statuses[0].LimitRemaining != 1 || r.Statuses[1].LimitRemaining != 1 || r.Statuses[1].CurrentLimit == nil {
			t.Fatalf("check: %v", r)
		}
	}
}

// A limit of 0 beside another: refused, and the other reports its state
// (uncharged) with a reset.
func TestZeroLimitBesideOthers(t *testing.T) {
	e := start(t, pairConfig+"  - key: zero\n    rate_limit: {unit: second, requests_per_unit: 0}\n", envOpts{})
	r := e.ask(t, "api", 0, desc("user", "z"), desc("zero", "x"))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].Code != rlsv3.RateLimitResponse_OK ||
		r.Statuses[0].LimitRemaining != 2 || r.Statuses[0].DurationUntilReset == nil || r.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("%v", r)
	}
}

// A failing store is Unavailable, with nothing of the store's error.
func TestStoreFailure(t *testing.T) {
	e := start(t, pairConfig, envOpts{wrap: func(b engine.GroupBackend) engine.GroupBackend {
		return failing{b}
	}})
	_, err := e.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u")}})
	st, _ := status.FromError(err)
	if st.Code() != codes.Unavailable || strings.Contains(st.Message(), "10.1.2.3") {
		t.Fatalf("%v", err)
	}
	// A request that matches no limit does not touch the store.
	if r := e.ask(t, "api", 0, desc("open", "x")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("%v", r)
	}
}

type failing struct{ engine.GroupBackend }

func (failing) DecideGroup(context.Context, []engine.Decision, engine.GroupRequest) (engine.GroupDecision, error) {
	return engine.GroupDecision{}, errors.New("dial tcp 10.1.2.3:6379: connection refused")
}

// RateLimit and RateLimit-Policy of the binding limit, when asked for.
func TestResponseHeaders(t *testing.T) {
	e := start(t, pairConfig, envOpts{opts: []rls.Option{rls.WithHeaders(true)}})
	headers := func(r *rlsv3.RateLimitResponse) map[string]string {
		m := map[string]string{}
		for _, h := range r.ResponseHeadersToAdd {
			m[h.Key] = h.Value
		}
		return m
	}
	r := e.ask(t, "api", 0, desc("user", "u"), desc("ip", "i"))
	if h := headers(r); len(h) != 2 || h["RateLimit-Policy"] != `"api.user";q=2;w=60` || h["RateLimit"] != `"api.user";r=1;t=60` {
		t.Fatalf("allowed: %v", h)
	}
	e.clk.Advance(20 * time.Second)
	e.ask(t, "api", 0, desc("user", "u"))
	e.clk.Advance(500 * time.Millisecond)
	r = e.ask(t, "api", 0, desc("user", "u"), desc("ip", "i"))
	if h := headers(r); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || h["RateLimit"] != `"api.user";r=0;t=40` || h["Retry-After"] != "40" {
		t.Fatalf("refused: %v", h)
	}
	// Only the limits' statuses, no headers, by default.
	plain := start(t, pairConfig, envOpts{})
	if r := plain.ask(t, "api", 0, desc("user", "u")); len(r.ResponseHeadersToAdd) != 0 {
		t.Fatalf("headers without WithHeaders: %v", r.ResponseHeadersToAdd)
	}
}

func TestMetrics(t *testing.T) {
	e := start(t, pairConfig, envOpts{})
	for i := 0; i < 4; i++ {
		e.ask(t, "api", 0, desc("user", "secret-user-id"), desc("open", "x"))
	}
	for _, c := range []struct {
		name, descriptor string
		want             float64
	}{
		{rls.MetricRequests, "user", 4},
		{rls.MetricRequests, "open", 4},
		{rls.MetricOverLimit, "user", 2},
		{rls.MetricNearLimit, "user", 1}, // the second request left 0 of 2
		{rls.MetricOverLimit, "ip", 0},
	} {
		if got := metric(t, e.reg, c.name, "descriptor", c.descriptor); got != c.want {
			t.Errorf("%s{descriptor=%q} = %v, want %v", c.name, c.descriptor, got, c.want)
		}
	}
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	gauges := map[string]float64{}
	for _, mf := range mfs {
		if len(mf.Metric) == 1 && mf.Metric[0].Gauge != nil {
			gauges[mf.GetName()] = mf.Metric[0].Gauge.GetValue()
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if strings.Contains(l.GetValue(), "secret-user-id") {
					t.Errorf("%s carries a request value: %v", mf.GetName(), m)
				}
			}
		}
		if mf.GetName() == rls.MetricLatency && mf.Metric[0].Histogram.GetSampleCount() != 4 {
			t.Errorf("latency samples %d", mf.Metric[0].Histogram.GetSampleCount())
		}
	}
	// One key (the user's) holding the two accepted requests.
	if gauges[mn.Keys] != 1 || gauges[mn.StoredInstants] != 2 || gauges[mn.StoreBytes] <= 0 {
		t.Errorf("store gauges %v", gauges)
	}
}

// metric returns the value of the counter name whose label has value (the
// sum when several do).
func metric(t testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			if hasLabel(m, label, value) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.Label {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

func TestHealthAndReflection(t *testing.T) {
	e := start(t, pairConfig, envOpts{})
	hc := healthpb.NewHealthClient(e.conn)
	for _, svc := range []string{"", rls.ServiceName} {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v %v", svc, r, err)
		}
	}
	rc := reflectionpb.NewServerReflectionClient(e.conn)
	stream, err := rc.ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.CloseSend()
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	for _, want := range []string{rls.ServiceName, "grpc.health.v1.Health"} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Errorf("reflection lists %q, not %s", names, want)
		}
	}
}

// GracefulStop lets a call in flight finish and answer.
func TestGracefulStopDrains(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e := start(t, pairConfig, envOpts{wrap: func(b engine.GroupBackend) engine.GroupBackend {
		return &blocking{GroupBackend: b, entered: func() { once.Do(func() { close(entered) }) }, release: release}
	}})
	done := make(chan error, 1)
	go func() {
		r, err := e.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u")}})
		if err == nil && r.OverallCode != rlsv3.RateLimitResponse_OK {
			err = errors.New(r.String())
		}
		done <- err
	}()
	<-entered
	stopped := make(chan struct{})
	go func() { e.gs.GracefulStop(); close(stopped) }()
	// The call is blocked inside the backend, so the stop cannot finish.
	select {
	case <-stopped:
		t.Fatal("GracefulStop returned with a call in flight")
	case err := <-done:
		t.Fatalf("the call ended before it was released: %v", err)
	default:
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("in-flight call: %v", err)
	}
	<-stopped
}

type blocking struct {
	engine.GroupBackend
	entered func()
	release chan struct{}
}

func (b *blocking) DecideGroup(ctx context.Context, dst []engine.Decision, req engine.GroupRequest) (engine.GroupDecision, error) {
	b.entered()
	<-b.release
	return b.GroupBackend.DecideGroup(ctx, dst, req)
}

const replacesConfig = `
domain: rep
descriptors:
  - key: api_key
    rate_limit: {name: per_key, unit: minute, requests_per_unit: 1}
  - key: plan
    value: gold
    rate_limit:
      name: gold
      unit: minute
      requests_per_unit: 3
      replaces: [{name: per_key}]
`

// A matched rule drops the matched rules it replaces.
func TestReplaces(t *testing.T) {
	e := start(t, replacesConfig, envOpts{})
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for i := range 3 { // gold: per_key (1) does not apply
		r := e.ask(t, "rep", 0, desc("api_key", "k1"), desc("plan", "gold"))
		if r.OverallCode != ok || r.Statuses[0].CurrentLimit != nil || r.Statuses[1].LimitRemaining != uint32(2-i) {
			t.Fatalf("gold %d: %v", i, r)
		}
	}
	if r := e.ask(t, "rep", 0, desc("api_key", "k1"), desc("plan", "gold")); r.OverallCode != over {
		t.Fatalf("gold past its limit: %v", r)
	}
	// Without the gold descriptor, per_key applies, and k1 was never
	// charged to it.
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, over} {
		if r := e.ask(t, "rep", 0, desc("api_key", "k1")); r.OverallCode != want || r.Statuses[0].CurrentLimit.GetName() != "per_key" {
			t.Fatalf("per_key %d: %v", i, r)
		}
	}
}

// A configuration whose rules limit nothing needs no backend.
func TestNoPolicies(t *testing.T) {
	cfg, err := rls.ParseConfig("u.yaml", []byte("domain: u\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n  - key: z\n    rate_limit: {unit: second, requests_per_unit: 0}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cfg.NewGroup(); !errors.Is(err, rls.ErrConfig) {
		t.Fatalf("NewGroup without policies: %v", err)
	}
	svc, err := rls.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key  string
		want rlsv3.RateLimitResponse_Code
	}{{"k", rlsv3.RateLimitResponse_OK}, {"z", rlsv3.RateLimitResponse_OVER_LIMIT}, {"other", rlsv3.RateLimitResponse_OK}} {
		r, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "u", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(c.key, "v")}})
		if err != nil || r.OverallCode != c.want {
			t.Fatalf("%s: %v %v", c.key, r, err)
		}
	}
	withPolicies, err := rls.ParseConfig("p.yaml", []byte(pairConfig))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rls.New(withPolicies, nil); err == nil {
		t.Fatal("New without a backend for a configuration with policies")
	}
}
