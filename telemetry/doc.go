// Package telemetry makes OpenTelemetry spans for slidegate's decisions
// and sends them to an OTLP endpoint (OTLP/HTTP or OTLP/gRPC).
//
// It is a module of its own so that programs that link engine or
// httplimit alone compile no OpenTelemetry code. The instrumented
// packages take plain hooks, and Tracing makes them:
//
//   - Handler: a server span per HTTP request, the child of the caller's
//     traceparent header.
//   - HTTPObserver: a span per decision of an httplimit.Middleware
//     (httplimit.WithObserver).
//   - UnaryServerInterceptor, StreamServerInterceptor and
//     UnaryClientInterceptor: spans per gRPC call, linked through the
//     call's metadata; an Envoy rate limit call also carries its domain
//     and outcome.
//   - GRPCLimitObserver: a span per decision of a grpclimit.Limiter.
//   - StoreHook: a span per Redis script call (redisstore.WithCallHook),
//     with the store kind and the node's address.
//   - Decision: a span for a decision made elsewhere.
//
// No span carries a client key: a key may be a user's address or API
// key. The attributes an operator filters on are the policy (or the Envoy
// domain), the outcome, the surface, the store kind and the node:
// slidegate.policy, slidegate.domain, slidegate.allowed,
// slidegate.surface, slidegate.store and server.address. A decision's
// span is slidegate.decide, a store call's slidegate.store;
// docs/operations.md lists every span.
//
// A nil *Tracing is tracing off: its hooks are nil, and the instrumented
// code then does no work at all. A Tracing is safe for concurrent use.
package telemetry
