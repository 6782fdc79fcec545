package loadtest

import (
	"context"
	"sync"
	"sync/atomic"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/lab/internal/keydist"
)

// The grpc phase's target. Its paced part proves the decisions right;
// its rounds judge the service's cost. In each round the rate limit
// service and a no-op gRPC server (the same RateLimitService answered OK
// without deciding, on a gRPC server with the service's options) each
// serve Config.GRPCRoundCalls calls at full speed from the same callers, in turn
// (which goes first alternates). A round's ratio is the no-op's CPU per
// call over the service's, this process's CPU (client and server) per
// call: like the capacity phase's CPU ratio, it does not depend on the
// share of the cores the run got. The target is judged on the rounds as
// every timed target is (judgeRounds).

// grpcTarget is the gRPC target. A round's figures are this process's
// CPU per call in nanoseconds, slidegate's the service's and the
// reference's the no-op's. The no-op's over the service's must be at
// least 0.80: the service's decision, its parsing of the descriptors and
// its answer add at most a quarter to gRPC's own cost.
var grpcTarget = turnTarget{goal: goal{Bound: 0.80}, costs: true}

// noopRLS answers every ShouldRateLimit OK, deciding nothing.
type noopRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

var noopOK = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}

func (noopRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return noopOK, nil
}

// startNoopRLS serves noopRLS over gRPC on 127.0.0.1:0 with the rate
// limit service's server options, and returns its address and how to
// stop it.
func startNoopRLS() (addr string, stop func(), err error) {
	gs := grpc.NewServer(
		grpc.MaxRecvMsgSize(rls.DefaultMaxRecvMsgSize),
		grpc.MaxConcurrentStreams(rls.DefaultMaxConcurrentStreams),
		grpc.NumStreamWorkers(rls.DefaultStreamWorkers),
		grpc.KeepaliveParams(rls.KeepaliveParams()),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: rls.MinPingInterval, PermitWithoutStream: true}),
	)
	rlsv3.RegisterRateLimitServiceServer(gs, noopRLS{})
	return serveLoopback(gs)
}

// grpcRounds is the clean rounds the grpc target is judged on: fifteen
// give the median's interval from the fourth smallest to the fourth
// largest round (96%), where five would give it from the smallest to the
// largest, so that one round another process slowed decided it.
const grpcRounds = 15

// runGRPCRounds runs the target's rounds, until rounds clean ones (or
// twice rounds in all): a fresh service of rc (not recorded: the paced
// part verified the decisions) against the no-op.
func runGRPCRounds(ctx context.Context, cfg Config, rc *rls.Config, p engine.Policy, rounds int) ([]turnRound, error) {
	group, err := rc.NewGroup(engine.WithPresize(cfg.Clients))
	if err != nil {
		return nil, err
	}
	defer group.Close()
	svcAddr, stopSvc, err := startRLS(rc, &grpcRecorder{GroupBackend: group, policy: p.Name})
	if err != nil {
		return nil, err
	}
	defer stopSvc()
	noopAddr, stopNoop, err := startNoopRLS()
	if err != nil {
		return nil, err
	}
	defer stopNoop()
	var all []*grpc.ClientConn
	defer func() {
		for _, c := range all {
			_ = c.Close()
		}
	}()
	svcConns, err := dialRLS(svcAddr, cfg.Connections)
	all = append(all, svcConns...)
	if err != nil {
		return nil, err
	}
	noopConns, err := dialRLS(noopAddr, cfg.Connections)
	all = append(all, noopConns...)
	if err != nil {
		return nil, err
	}
	// A warm-up burst on each, so that connection setup and the first
	// allocations of either stay out of the rounds.
	for _, conns := range [][]*grpc.ClientConn{svcConns, noopConns} {
		if _, _, err := grpcBurst(ctx, cfg, conns, 1000, 0); err != nil {
			return nil, err
		}
	}
	return runTurns(rounds, func(r int, noop bool) (float64, int, float64, error) {
		conns := svcConns
		if noop {
			conns = noopConns
		}
		cpu, errs, err := grpcBurst(ctx, cfg, conns, int64(cfg.GRPCRoundCalls), uint64(r))
		return cpu, errs, 0, err
	})
}

// grpcBurst makes n ShouldRateLimit calls over conns at full speed, one
// caller per connection, and returns this process's CPU per call in
// nanoseconds and the calls that failed.
func grpcBurst(ctx context.Context, cfg Config, conns []*grpc.ClientConn, n int64, round uint64) (cpuNs float64, errs int, err error) {
	var left atomic.Int64
	left.Store(n)
	var failed atomic.Int64
	var wg sync.WaitGroup
	cpu0 := cpuSeconds()
	for c, conn := range conns {
		ch, err := keydist.NewChooser(cfg.Dist, cfg.Clients, cfg.ZipfS, cfg.Seed, 1_000_000+round*4096+uint64(c))
		if err != nil {
			wg.Wait()
			return 0, 0, err
		}
		client := rlsv3.NewRateLimitServiceClient(conn)
		wg.Go(func() {
			entry := &ratelimitv3.RateLimitDescriptor_Entry{Key: grpcKey}
			req := &rlsv3.RateLimitRequest{Domain: grpcDomain, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{entry}}}}
			for left.Add(-1) >= 0 && ctx.Err() == nil {
				entry.Value = clientKey(ch.Next())
				cctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
				if _, err := client.ShouldRateLimit(cctx, req); err != nil {
					failed.Add(1)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	return (cpuSeconds() - cpu0) / float64(n) * 1e9, int(failed.Load()), nil
}

// writeRounds writes the rounds of the grpc phase's target.
func (g *grpcReport) writeRounds(p func(string, ...any)) {
	if len(g.Rounds) == 0 {
		return
	}
	p("  target: %d rounds of %s calls per target at full speed to the service and to a no-op gRPC server in turn; this process's CPU per call:",
		len(g.Rounds), commas(int64(g.RoundCalls)))
	for i, rd := range g.Rounds {
		p("    round %d: service %s, no-op %s; no-op / service %s%s", i+1, fmtNs(int64(rd.Slidegate)), fmtNs(int64(rd.Reference)),
			fmtRatio(grpcTarget.ratio(rd), grpcTarget.Bound), rd.note("calls failed"))
	}
}
