package rlsclient_test

// A bad rate limit service: the client believes an answer only within
// bounds it can check.

import (
	"context"
	"net"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidegate/slidegate/remote/rlsclient"
)

// badRLS answers every ShouldRateLimit with resp.
type badRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	resp *rlsv3.RateLimitResponse
}

func (b badRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return b.resp, nil
}

// serveBadRLS serves resp on a loopback gRPC listener until the test ends.
func serveBadRLS(t *testing.T, resp *rlsv3.RateLimitResponse) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, badRLS{resp: resp})
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	t.Cleanup(func() { gs.Stop(); <-done })
	return lis.Addr().String()
}

// TestBogusRLSAnswerClamped: the RLS client believes a status no further
// than it can check. A refusal with a negative duration until reset
// waits the window; a huge one waits at most twice the window; a
// remaining count above the limit is the limit; an OK overall code beside
// an over-limit status is a refusal; a unit multiplier that overflows
// time.Duration saturates rather than turning negative; statuses beyond
// the descriptors sent are dropped.
func TestBogusRLSAnswerClamped(t *testing.T) {
	minute := &rlsv3.RateLimitResponse_RateLimit{Name: "m", RequestsPerUnit: 5, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: minute, LimitRemaining: 9, DurationUntilReset: durationpb.New(-9e18)},
			{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: minute, LimitRemaining: 1 << 31, DurationUntilReset: &durationpb.Duration{Seconds: 1 << 40}},
			{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1, Unit: rlsv3.RateLimitResponse_RateLimit_WEEK, UnitMultiplier: wrapperspb.UInt32(1 << 31)}},
			{Code: rlsv3.RateLimitResponse_OK}, // a fourth, for three descriptors
		},
	}
	c := dialRLS(t, serveBadRLS(t, resp))
	defer c.Close()
	d := rlsclient.Descriptor{Entries: []rlsclient.Entry{{Key: "k", Value: "v"}}}
	got, err := c.ShouldRateLimit(context.Background(), "edge", []rlsclient.Descriptor{d, d, d}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got.Allowed || got.Fallback || len(got.Statuses) != 3 {
		t.Fatalf("%+v, want a refusal by the server with 3 statuses", got)
	}
	if s := got.Statuses[0]; !s.OverLimit || s.Reset != time.Minute || s.Remaining != 0 {
		t.Errorf("the refused status: %+v, want Reset 1m and Remaining 0", s)
	}
	if s := got.Statuses[1]; s.Reset != 2*time.Minute || s.Remaining != 5 {
		t.Errorf("the second status: %+v, want Reset 2m and Remaining 5", s)
	}
	if s := got.Statuses[2]; s.Window <= 0 {
		t.Errorf("the third status: %+v, want a positive window", s)
	}
}
