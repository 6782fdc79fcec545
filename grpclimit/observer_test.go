package grpclimit_test

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/slidegate/slidegate/grpclimit"
)

// TestObserver: the observer sees each decision of a call over a real
// listener, on the call's context (with its incoming metadata), with the
// method, the policy, the cost and the outcome; exempt calls make none.
func TestObserver(t *testing.T) {
	var (
		mu     sync.Mutex
		events []grpclimit.Event
	)
	f := start(t, twoPerMinute, true, grpclimit.WithExempt(func(m string) bool { return m == "/grpc.testing.TestService/UnaryCall" }),
		grpclimit.WithObserver(func(ev grpclimit.Event) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, ev)
		}))
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		if _, err := f.client.EmptyCall(ctx, &testpb.Empty{}); status.Code(err) != want {
			t.Fatalf("call %d: %v, want %v", i, err, want)
		}
	}
	_, _ = f.client.UnaryCall(ctx, &testpb.SimpleRequest{}) // exempt
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 3 {
		t.Fatalf("observer saw %d decisions, want 3", len(events))
	}
	for i, ev := range events {
		md, _ := metadata.FromIncomingContext(ev.Ctx)
		if ev.FullMethod != "/grpc.testing.TestService/EmptyCall" || ev.Policy != "free" || ev.Cost != 1 || ev.Err != nil ||
			ev.Decision.Allowed != (i < 2) || len(md.Get("traceparent")) != 1 {
			t.Errorf("event %d: %+v (metadata %v)", i, ev, md)
		}
	}
}
