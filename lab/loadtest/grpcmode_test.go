package loadtest

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// The grpc phase drives the Envoy rate limit service over loopback gRPC,
// small limits and a short window so that both outcomes occur, and every
// decision the service made replays through the reference.
func TestGRPCMode(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Modes = []string{ModeGRPC}
	cfg.Clients, cfg.Limit, cfg.Window, cfg.MaxCost = 50, 5, 200*time.Millisecond, 2
	cfg.Rate, cfg.HTTPDuration, cfg.Connections = 400, time.Second, 4
	cfg.Out, cfg.Progress = t.TempDir(), "off"
	var out bytes.Buffer
	rep, err := run(context.Background(), cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	g := rep.GRPC
	if g == nil || g.Requests != 400 || g.Errors != 0 || g.Disagreement != "" {
		t.Fatalf("grpc report %+v", g)
	}
	v := g.Verification
	if !v.OK() || v.Records != 400 || v.Allowed != int(g.Allowed) || g.Allowed == 0 || g.Refused == 0 || !rep.Correct {
		t.Fatalf("verification %+v, allowed %d refused %d, correct %v %v", v, g.Allowed, g.Refused, rep.Correct, rep.Failures)
	}
	if !strings.Contains(out.String(), "ShouldRateLimit: 400 calls") || !strings.Contains(out.String(), "p99.9") {
		t.Errorf("summary:\n%s", out.String())
	}
}
