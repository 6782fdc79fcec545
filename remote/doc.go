// Package remote is a client for a remote slidegate serve: its decision
// API (POST /v1/allow) over HTTP, as engine.Backend and
// engine.GroupBackend, so that httplimit and grpclimit enforce a limit
// kept by a shared server without change.
//
// Dial makes a Client for the server's base URL; Client.Limiter returns a
// Backend for one of the server's policies and Client.Group a
// GroupBackend over several, all or nothing. The policies given must be
// the server's (name, limit, window and algorithm): the name says which
// policy the server applies, the rest sizes the local fallback and is
// checked against every answer (ErrPolicyMismatch).
//
// Every decision is one HTTP request on a pooled keep-alive connection,
// bounded by a timeout (WithTimeout, default DefaultTimeout). When the
// server cannot decide (unreachable, slower than the timeout, a 5xx
// answer), the failure policy does, as in redisstore: FailLocal (the
// default) decides with an in-memory limiter of the same policy, FailOpen
// allows, FailClosed refuses and returns an error wrapping
// ErrUnavailable. After DefaultBreakerThreshold failed calls in a row, or
// when most recent calls fail, a circuit breaker sends decisions to the
// failure policy at once (cause ErrBreakerOpen) until a probe succeeds
// (WithBreaker). A 4xx answer (bad input) is an error wrapping
// ErrRejected, never a failure-policy decision.
//
// The client trusts an answer only as far as it can check it. Limit must
// be the policy's (ErrPolicyMismatch). Remaining is clamped to 0..Limit
// and Reset to 0..W, where W is the window (twice the window for the
// counter algorithm, whose refusals last longer). A refusal whose
// RetryAfter is not within (0, W] retries after W. An At below 0 or
// above 2^62 ns is replaced by the local clock's instant, and never
// anchors the clock of the local fallback. A group's answer is all or
// nothing the stricter way: any refusing limit refuses it, and a refusal
// naming no refusing limit is one by every limit. A server's error text
// is cut to 200 bytes.
//
// A Client, and the Limiters and Groups it makes, are safe for concurrent
// use. Client.Close closes them all.
//
//	c, err := remote.Dial("http://slidegate:8080")
//	if err != nil { ... }
//	defer c.Close()
//	l, err := c.Limiter(engine.Policy{Name: "api", Limit: 100, Window: time.Minute})
//	if err != nil { ... }
//	mw, err := httplimit.New(httplimit.WithBackend(l))
//
// # The rate limit service
//
// Package rlsclient (remote/rlsclient) asks the Envoy rate limit service
// (v3, ShouldRateLimit) that slidegate serve --grpc and slidegate envoy
// serve answer. It is a package of its own so that this package's users
// do not compile gRPC. Use Dial and its Limiters when a Go service
// enforces a slidegate policy itself (httplimit, grpclimit); use
// rlsclient.Dial to ask the descriptor rules an Envoy deployment already
// shares.
package remote
