package remote_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/grpclimit"
)

// grpclimit enforces a remote limit unchanged: a real gRPC server whose
// interceptor decides with a remote Limiter refuses the third call at
// limit 2 with ResourceExhausted.
func TestGRPCLimit(t *testing.T) {
	p := engine.Policy{Name: "rpc", Limit: 2, Window: time.Minute}
	base, _, _ := serve(t, []engine.Policy{p}, nil)
	c := dial(t, base)
	defer c.Close()
	l, err := c.Limiter(p)
	if err != nil {
		t.Fatal(err)
	}
	gl, err := grpclimit.New(grpclimit.WithBackend(l), grpclimit.WithKeyFunc(func(context.Context, string) (string, error) { return "svc", nil }))
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(gl.UnaryServerInterceptor()))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	defer func() { gs.Stop(); <-served }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if got, want := status.Code(err), []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted}[i]; got != want {
			t.Fatalf("call %d: %v, want %v", i, err, want)
		}
	}
}
