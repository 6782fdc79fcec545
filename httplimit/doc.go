// Package httplimit is net/http middleware that rate-limits requests with
// slidegate's engine (or any engine.Backend, such as the Redis backend).
//
// # Tour
//
// [New] (or [Limit], for the func(http.Handler) http.Handler shape) builds
// a [Middleware] from options: one backend per tier ([WithBackend]), how a
// request's tier is chosen ([WithTierFunc], e.g. [HeaderTier]("X-Plan")),
// how its key is derived ([WithKeyFunc]: [ClientIP], [HeaderKey],
// [RouteKey] and [Compose]), exempt requests ([WithExempt]),
// shadow mode ([WithShadow]), the header families written ([WithHeaders]),
// and how refusals and errors are answered ([WithRefusalHandler],
// [WithErrorHandler]).
//
// A tier may hold several limits ([WithLimits]): 10 per second and 1,000
// per hour on one API key, a per-user and a per-IP limit. Its requests are
// decided all or nothing by an [engine.GroupBackend] ([engine.Group]): allowed
// only if every limit has room, and a refusal by any limit charges none.
// Stacking one middleware per limit cannot do that, since the outer one
// counts the requests the inner one refuses. RateLimit-Policy then lists
// every policy; the other headers report the binding limit.
//
// Every decided response carries, unless switched off:
//
//	RateLimit-Policy: "free";q=100;w=60
//	RateLimit: "free";r=42;t=17
//	X-RateLimit-Limit: 100
//	X-RateLimit-Remaining: 42
//	X-RateLimit-Reset: 1764433217
//
// t is Decision.Reset (when the oldest live entry leaves the window) in
// seconds rounded up; X-RateLimit-Reset is that moment in epoch seconds,
// rounded up. A refusal is 429 with Retry-After (Decision.RetryAfter in
// seconds, rounded up, so waiting that long always suffices) and an
// application/problem+json body naming the policy and the retry time (and
// "reason":"key_cap" when the backend's key cap refused a new key). A
// request whose key cannot be derived, whose key is longer than MaxKeyLen,
// or that names an unknown tier or two tiers, is answered 400: it is never
// charged to a shared bucket.
//
// Keys are bounded against hostile clients: ClientIP believes one
// forwarding header (ClientIP.Header), from trusted proxies only; Route
// cleans the path so that one route has one key however it is spelt; and
// every key, composed keys included, is at most MaxKeyLen bytes.
//
// # Concurrency
//
// A Middleware is safe for concurrent use. The
// backends are the caller's: close them when done.
//
// # Example
//
//	lim, err := engine.New(engine.Policy{Name: "free", Limit: 100, Window: time.Minute})
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer lim.Close()
//	limit, err := httplimit.Limit(
//		httplimit.WithBackend(lim),
//		httplimit.WithKeyFunc(httplimit.HeaderKey("X-API-Key")),
//	)
//	if err != nil {
//		log.Fatal(err)
//	}
//	log.Fatal(http.ListenAndServe("127.0.0.1:8080", limit(myHandler)))
package httplimit
