// Package otlptest is an OTLP trace receiver for tests: it listens on
// loopback for OTLP/gRPC and OTLP/HTTP (protobuf), decodes what exporters
// send, and keeps the spans with their resources.
package otlptest

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, its attributes flattened to strings, with
// its resource's attributes.
type Span struct {
	Name     string
	Kind     tracepb.Span_SpanKind
	TraceID  string // hex
	SpanID   string // hex
	ParentID string // hex, "" for a root
	Attrs    map[string]string
	Resource map[string]string
	Status   tracepb.Status_StatusCode
	// Events holds the events' attributes (RecordError's exception.*).
	Events []map[string]string
	// Via is "grpc" or "http": how the span arrived.
	Via string
}

// Receiver accepts OTLP trace exports over gRPC and HTTP on loopback.
type Receiver struct {
	collectortrace.UnimplementedTraceServiceServer

	// GRPCAddr is the OTLP/gRPC listener's host:port; HTTPURL the
	// OTLP/HTTP listener's base URL (exporters post to /v1/traces).
	GRPCAddr string
	HTTPURL  string

	gs   *grpc.Server
	hs   *http.Server
	done sync.WaitGroup

	mu    sync.Mutex
	spans []Span
}

// Start starts a receiver; the test's cleanup stops it.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{gs: grpc.NewServer()}
	collectortrace.RegisterTraceServiceServer(r.gs, r)
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		gl.Close()
		t.Fatal(err)
	}
	r.GRPCAddr = gl.Addr().String()
	r.HTTPURL = "http://" + hl.Addr().String()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.serveHTTP)
	r.hs = &http.Server{Handler: mux}
	r.done.Add(2)
	go func() { defer r.done.Done(); _ = r.gs.Serve(gl) }()
	go func() { defer r.done.Done(); _ = r.hs.Serve(hl) }()
	t.Cleanup(r.Close)
	return r
}

// Close stops both listeners and waits for their goroutines.
func (r *Receiver) Close() {
	r.gs.Stop()
	_ = r.hs.Close()
	r.done.Wait()
}

// Export is the OTLP/gRPC trace service.
func (r *Receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.add(req, "grpc")
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "want application/x-protobuf, got "+ct, http.StatusUnsupportedMediaType)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, 16<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var m collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &m); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.add(&m, "http")
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *Receiver) add(req *collectortrace.ExportTraceServiceRequest, via string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		res := flatten(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					Name: s.GetName(), Kind: s.GetKind(),
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentID: hex.EncodeToString(s.GetParentSpanId()),
					Attrs:    flatten(s.GetAttributes()), Resource: res, Status: s.GetStatus().GetCode(), Via: via,
				}
				for _, e := range s.GetEvents() {
					sp.Events = append(sp.Events, flatten(e.GetAttributes()))
				}
				r.spans = append(r.spans, sp)
			}
		}
	}
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Named returns the received spans called name.
func (r *Receiver) Named(name string) []Span {
	var out []Span
	for _, s := range r.Spans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// Containing returns a description of every place (span name, attribute,
// resource attribute or event attribute) whose value contains s: for
// asserting that a secret never left the process.
func (r *Receiver) Containing(s string) []string {
	var out []string
	for _, sp := range r.Spans() {
		if strings.Contains(sp.Name, s) {
			out = append(out, "span name "+sp.Name)
		}
		for _, m := range append([]map[string]string{sp.Attrs, sp.Resource}, sp.Events...) {
			for k, v := range m {
				if strings.Contains(k, s) || strings.Contains(v, s) {
					out = append(out, fmt.Sprintf("span %s: %s=%s", sp.Name, k, v))
				}
			}
		}
	}
	return out
}

func flatten(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = value(kv.GetValue())
	}
	return m
}

func value(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	case *commonpb.AnyValue_BytesValue:
		return hex.EncodeToString(x.BytesValue)
	case *commonpb.AnyValue_ArrayValue:
		parts := make([]string, 0, len(x.ArrayValue.GetValues()))
		for _, e := range x.ArrayValue.GetValues() {
			parts = append(parts, value(e))
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	return fmt.Sprint(v)
}
