package telemetry_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/telemetry"
)

// Tracing httplimit's middleware: Handler makes the request's span (the
// child of the caller's traceparent), HTTPObserver a span per decision
// under it. A program that sends to a collector builds its Tracing with
// New instead; this one keeps the spans in memory to print them.
func Example() {
	exp := tracetest.NewInMemoryExporter()
	tr := telemetry.NewWithProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))

	lim, err := engine.New(engine.Policy{Name: "free", Limit: 1, Window: time.Minute})
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	mw, err := httplimit.New(httplimit.WithBackend(lim), httplimit.WithObserver(tr.HTTPObserver("middleware")))
	if err != nil {
		panic(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	srv := httptest.NewServer(tr.Handler("middleware", mw.Handler(ok)))

	for range 2 {
		resp, err := http.Get(srv.URL + "/")
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode)
	}
	srv.Close() // waits for the handlers, whose spans end before they return
	for _, s := range exp.GetSpans() {
		attrs := map[string]string{}
		for _, kv := range s.Attributes {
			attrs[string(kv.Key)] = kv.Value.String()
		}
		if s.Name == "slidegate.decide" {
			fmt.Println(s.Name, "policy="+attrs["slidegate.policy"], "allowed="+attrs["slidegate.allowed"])
		} else {
			fmt.Println(s.Name, "status="+attrs["http.response.status_code"])
		}
	}
	// Output:
	// 204
	// 429
	// slidegate.decide policy=free allowed=true
	// GET status=204
	// slidegate.decide policy=free allowed=false
	// GET status=429
}
