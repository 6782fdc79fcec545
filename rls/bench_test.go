package rls_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/rls"
)

// The benchmark configuration: a per-user limit and a per-route limit,
// both on every request, as an Envoy route with two actions sends them.
const benchConfig = `
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: route
    rate_limit: {unit: second, requests_per_unit: 1000000}
`

const benchUsers = 10_000

func benchRequests() []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, benchUsers)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("user", "u"+strconv.Itoa(i)), desc("route", "/api"),
		}}
	}
	return reqs
}

// The service called in process: matching, validation, the group decision
// and the response, without gRPC.
func BenchmarkShouldRateLimitInProcess(b *testing.B) {
	cfg, err := rls.ParseConfig("bench.yaml", []byte(benchConfig))
	if err != nil {
		b.Fatal(err)
	}
	g, err := cfg.NewGroup()
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	svc, err := rls.New(cfg, g)
	if err != nil {
		b.Fatal(err)
	}
	reqs := benchRequests()
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919))
		for pb.Next() {
			i++
			if _, err := svc.ShouldRateLimit(context.Background(), reqs[i%benchUsers]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// The engine decision alone, the same two refs per request: the floor of
// the in-process row.
func BenchmarkGroupFloor(b *testing.B) {
	cfg, err := rls.ParseConfig("bench.yaml", []byte(benchConfig))
	if err != nil {
		b.Fatal(err)
	}
	g, err := cfg.NewGroup()
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	keys := make([]string, benchUsers)
	for i := range keys {
		keys[i] = "u" + strconv.Itoa(i)
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919))
		var dst [2]engine.Decision
		for pb.Next() {
			i++
			_, _ = g.AllowRefsN(dst[:0], []engine.Ref{{Policy: 0, Key: keys[i%benchUsers]}, {Policy: 1, Key: "/api"}}, 1)
		}
	})
}

// Through a real gRPC connection on loopback, as Envoy calls it.
func BenchmarkShouldRateLimitGRPC(b *testing.B) {
	e := start(b, benchConfig, envOpts{real: true})
	reqs := benchRequests()
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919))
		for pb.Next() {
			i++
			if _, err := e.client.ShouldRateLimit(context.Background(), reqs[i%benchUsers]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// A health check over the same kind of connection: the floor of the gRPC
// row (what a call costs that decides nothing).
func BenchmarkGRPCFloor(b *testing.B) {
	e := start(b, benchConfig, envOpts{real: true})
	hc := healthpb.NewHealthClient(e.conn)
	req := &healthpb.HealthCheckRequest{}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := hc.Check(context.Background(), req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
