package envoy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc/metadata"

	"github.com/slidegate/slidegate/telemetry/otlptest"
)

// rowSpanNames is docs/envoy.md's row of the tracing difference.
const rowSpanNames = "Span names."

// tracedCall sends one request of the peer's TestServiceTracer
// (test-domain, hello=world: no limit) as the child of a new
// traceparent, and returns the trace and parent span IDs.
func tracedCall(c *chk) (traceID, parentID string) {
	id := make([]byte, 24)
	_, _ = rand.Read(id)
	traceID, parentID = hex.EncodeToString(id[:16]), hex.EncodeToString(id[16:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+traceID+"-"+parentID+"-01")
	r := req("test-domain", []string{"hello", "world"})
	resp, err := c.p.rl.ShouldRateLimit(ctx, r)
	switch {
	case err != nil:
		c.errorf("%s: %v", reqString(r), err)
	case resp.OverallCode != codeOK || len(resp.Statuses) != 1 || resp.Statuses[0].Code != codeOK || resp.Statuses[0].CurrentLimit != nil:
		c.errorf("%s: %v, want OK without a limit", reqString(r), resp)
	}
	return traceID, parentID
}

// spansOf waits (60 s at most) until the receiver holds a span of trace
// named name, then returns every span of the trace with that name.
func spansOf(c *chk, rcv *otlptest.Receiver, traceID, name string) []otlptest.Span {
	deadline := time.Now().Add(60 * time.Second)
	for {
		var out []otlptest.Span
		for _, s := range rcv.Spans() {
			if s.TraceID == traceID && s.Name == name {
				out = append(out, s)
			}
		}
		if len(out) > 0 {
			return out
		}
		if time.Now().After(deadline) {
			c.errorf("no span %q of trace %s within 60 s", name, traceID)
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tracerCase is TestServiceTracer: the peer's test records, with its test
// exporter, exactly one span named "ShouldRateLimit Execution" for one
// request. Here both services export over OTLP/HTTP (TRACING_ENABLED,
// OTEL_EXPORTER_OTLP_ENDPOINT) to a receiver on loopback, and each call
// carries a traceparent of its own, which tells the two services' spans
// apart. slidegate names the call's server span by its gRPC method and
// has no span of the peer's name (docs/envoy.md, "Span names").
func tracerCase(t *testing.T, files map[string]string) suiteCase {
	rcv := otlptest.Start(t)
	const peerName = "ShouldRateLimit Execution"
	const method = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	return suiteCase{name: "TestServiceTracer", files: files,
		env: map[string]string{"TRACING_ENABLED": "true", "TRACING_EXPORTER_PROTOCOL": "http", "OTEL_EXPORTER_OTLP_ENDPOINT": rcv.HTTPURL,
			"OTEL_BSP_SCHEDULE_DELAY": "200"},
		check: func(c *chk) {
			traceID, _ := tracedCall(c)
			if got := spansOf(c, rcv, traceID, peerName); got != nil && len(got) != 1 {
				c.errorf("%d spans %q in the call's trace, want 1", len(got), peerName)
			}
		},
		differs: []string{rowSpanNames},
		sgCheck: func(c *chk, up bool) {
			if !up {
				c.errorf("slidegate exited: %s", lastLine(c.p.out.String()))
				return
			}
			traceID, parentID := tracedCall(c)
			got := spansOf(c, rcv, traceID, method)
			if len(got) != 1 {
				c.errorf("%d spans %q in the call's trace, want 1", len(got), method)
				return
			}
			s := got[0]
			if s.Kind != tracepb.Span_SPAN_KIND_SERVER || s.ParentID != parentID || s.Attrs["slidegate.domain"] != "test-domain" || s.Attrs["slidegate.allowed"] != "true" {
				c.errorf("span %q: kind %v, parent %s (want %s), slidegate.domain %q, slidegate.allowed %q", method, s.Kind, s.ParentID, parentID,
					s.Attrs["slidegate.domain"], s.Attrs["slidegate.allowed"])
			}
			for _, sp := range rcv.Spans() {
				if sp.TraceID == traceID && sp.Name == peerName {
					c.errorf("slidegate sent a span named %q", peerName)
				}
			}
		}}
}
