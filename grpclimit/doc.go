// Package grpclimit rate-limits the calls of a grpc-go server with
// slidegate's engine (or any engine.Backend, such as the Redis backend),
// as httplimit does for net/http.
//
// [New] builds a [Limiter] from options: the backend ([WithBackend],
// required), how calls are keyed ([WithKeyFunc]: [PeerKey], the client's address with
// httplimit's trusted-proxy rules applied to one forwarding metadata key,
// x-forwarded-for unless ClientIP.Header names another; MetadataKey, such
// as an API key; MethodKey to give each method its own limit; or any
// function), the cost of a call
// (WithCostFunc), exempt methods (WithExempt) and shadow mode
// ([WithShadow]). Its [Limiter.UnaryServerInterceptor] and
// [Limiter.StreamServerInterceptor] go
// into grpc.NewServer; a stream counts once, when it opens.
//
// An allowed call carries the metadata
//
//	ratelimit-policy: "free";q=100;w=60
//	ratelimit: "free";r=42;t=17
//
// (the IETF draft's RateLimit-Policy and RateLimit headers; q is the
// limit, w the window in seconds, r the remaining quota, t the seconds
// until the oldest entry leaves the window). A refused call ends with
// codes.ResourceExhausted, a google.rpc.RetryInfo detail holding the exact
// wait, and the trailers retry-after (the wait in seconds, rounded up),
// ratelimit and ratelimit-policy. The handler never runs for it.
//
// Client-controlled input is bounded: keys taken from metadata are at most
// httplimit.MaxKeyLen (1024) bytes, and the whole metadata of a call by the server's
// grpc.MaxHeaderListSize. grpc-go's default is 16 MiB decoded, and HPACK
// lets a client fill it with a few bytes on the wire: a server facing
// hostile clients should set far less, such as the 64 KiB slidegate's
// own rate limit service sets. A call over it is reset by the transport
// before any interceptor runs.
//
// The package imports no server code: only engine and httplimit's
// client-address rules.
package grpclimit
