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
	cfg.GRPCRoundCalls = 200
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
	// The target's rounds ran, the service against the no-op, and the
	// target is judged on them.
	if len(g.Rounds) < grpcRounds || len(g.Rounds) > 2*grpcRounds || len(rep.Targets) != 1 || len(rep.Targets[0].Spread.Rounds) != len(g.Rounds) ||
		!strings.Contains(out.String(), "no-op / service") {
		t.Errorf("rounds %+v, targets %+v", g.Rounds, rep.Targets)
	}
	for _, rd := range g.Rounds {
		if !(rd.Slidegate > 0) || !(rd.Reference > 0) || rd.Errors != 0 {
			t.Errorf("round %+v", rd)
		}
	}
}
