package rls_test

import (
	"context"
	"fmt"
	"net"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/slidegate/slidegate/internal/rls"
)

func Example() {
	cfg, err := rls.ParseConfig("ratelimit.yaml", []byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 2
`))
	if err != nil {
		panic(err)
	}
	group, err := cfg.NewGroup()
	if err != nil {
		panic(err)
	}
	defer group.Close()
	svc, err := rls.New(cfg, group)
	if err != nil {
		panic(err)
	}
	gs, _ := rls.NewGRPCServer(svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go gs.Serve(lis)
	defer gs.GracefulStop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "192.0.2.1"}},
	}}}
	for range 3 {
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			panic(err)
		}
		fmt.Println(resp.OverallCode, resp.Statuses[0].LimitRemaining)
	}
	// Output:
	// OK 1
	// OK 0
	// OVER_LIMIT 0
}
