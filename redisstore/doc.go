// Package redisstore keeps slidegate's limits in Redis or Redis Cluster,
// so that a fleet of replicas shares one limit per client: two replicas
// with their own in-memory limiters admit up to 2L; two replicas on one
// Redis admit L. The semantics are the engine's exactly (docs/semantics.md):
// same policies, same Decision fields, same refusals.
//
// # Tour
//
// Open connects to a store URL and returns a Store: one client, one
// circuit breaker per Redis node, one set of metrics. Open refuses a
// server whose maxmemory-policy may evict the limiter's keys (a forgotten
// limit) unless WithEvictionAllowed says otherwise. Store.Limiter (or
// Store.Limiters) makes a Limiter per engine.Policy; a Limiter implements
// engine.Backend and engine.KeyAdmin. NewGroup groups a store's limiters
// into a Group, which decides a request over several of them all or
// nothing in one script call (engine.GroupBackend). The Store owns all of
// it: Store.Close is the one closer. New opens a store for one policy and
// returns a limiter that owns it:
//
//	lim, err := redisstore.New("redis://127.0.0.1:6379/0",
//		engine.Policy{Name: "free", Limit: 100, Window: time.Minute},
//		redisstore.WithFailurePolicy(redisstore.FailLocal))
//	if err != nil { ... }             // bad URL, unreachable, auth failure
//	defer lim.Close()
//	d, err := lim.Decide(ctx, "client-42", 1)
//
// URLs (Open; docs/distributed.md has an example of each) are read by
// rueidis.ParseURL: redis:// and rediss:// (TLS) for one server, unix://
// for a socket, redis-cluster:// and rediss-cluster:// for Redis Cluster,
// redis-sentinel:// and rediss-sentinel:// with ?master_set=NAME for
// Sentinel. TLS verifies servers with the system's roots unless
// WithTLSConfig (or store_options' tls_ca_file) names others; its
// Certificates (or tls_cert_file and tls_key_file) present a client
// certificate. A program that already holds a rueidis or go-redis
// client passes it to OpenClient instead (RueidisClient, package
// goredisstore).
//
// # How a decision is made
//
// Each decision is one call of a Lua script that reads the key's state,
// evicts expired entries, decides, appends and sets the TTL atomically. On
// Redis 7 the scripts are Redis Functions, loaded once per master, and a
// decision is one FCALL; where Functions are refused (Redis 6.2, an ACL)
// it is one EVALSHA (falling back to EVAL once after NOSCRIPT, when a
// restarted or failed-over server has lost its script cache). A refused
// request writes no entry. The
// log is a ring of 4-byte offsets in one Redis string per client (5 or 6
// bytes for windows beyond an hour or 11 days): about 4.2 bytes per entry
// at L = 1,000 and 5.4 at L = 100, where a sorted set costs 21 and 119. A
// client with one request has no key of its own: it is a field of a hash
// shared by its policy's clients in its cluster slot, about 31 bytes per
// client at a million clients, where one sorted set per client costs 177
// (docs/distributed.md has the measurements). The sliding window counter
// (engine.SlidingCounter) is 32 bytes per client.
//
// Time: by default the script reads Redis TIME, so every replica shares the
// server's timeline whatever their own clocks say. Its resolution is one
// microsecond: Decision.At is Unix nanoseconds, a multiple of 1000, and
// windows must be whole microseconds. Per key, instants never decrease,
// even if the server's clock steps back: the key stores its latest decision
// instant (its watermark) and decides later requests at it. WithClock
// substitutes the caller's clock, for tests and deterministic replays.
//
// Keys are prefix + policy + ":{" + slot tag + "}" + client key, where the
// slot tag is a short string chosen by a hash of the client key: the Redis
// Cluster slot follows the hash, so no choice of client keys can pile them
// into one slot (one master). A decision touches keys of that one slot
// only (no CROSSSLOT): the client's own key and, for the log, its bucket,
// prefix + policy + ":1{" + slot tag + "}". Limiter.DecideTagged, and
// Group.DecideGroup with a Tag on a cluster, place keys by a tag the
// caller names instead, so that the keys of one multi-limit request share
// a slot; on a cluster, Group.DecideGroup over different
// client keys without a tag decides across their slots, all or nothing
// (one call per slot, entries given back when any slot refuses).
//
// # Failures
//
// Every call has a deadline (WithTimeout, default 50 ms) and is never
// retried by the client: a retry after a timeout could run the script twice
// and charge one request two slots. When Redis cannot decide, the failure
// policy does: FailLocal (the default) decides with an in-memory
// engine.Limiter, FailOpen allows, FailClosed refuses with an error
// wrapping ErrUnavailable; such decisions have Decision.Fallback set, are
// counted, and logged at most once per ten seconds with their cause. A
// call that misses its deadline is not a failure by itself: the node is
// probed (PING on a connection of its own; a reply that waits unread in
// the socket after the grace counts, so a busy host is not taken for a
// hung node); if it answers, the host or Redis is slow, not down, and
// under FailLocal the request, whose script may have run, is refused
// (Fallback set) instead of decided locally; if it does not, its breaker
// opens. Each Redis node (the standalone server, or each
// cluster master by the slot map) has its own circuit breaker, so a
// failing master sends only its own keys to the failure policy: after
// WithBreaker's threshold of consecutive failures (errors and lost
// connections, not timeouts), or when most of a node's recent calls fail,
// or when it does not answer a probe, its breaker opens and its keys go straight to
// the failure policy, costing nothing; after the cooldown one probe tests
// the node and its success closes the breaker. Each transition is logged
// (slog) and counted (Store.Collector). A background health check
// (WithHealthInterval) re-reads the slot map and logs and counts node
// restarts (the run id changed: without persistence, limits were lost)
// and evictions. Calls that failed after being sent may still have run
// on the server; they are counted as unknown outcomes.
//
// A bounded local cache of refusals (WithRefusalCache) answers an abusive
// client without a round trip: a key refused with RetryAfter r is refused
// locally until r has passed, timed from when the refused call was sent, so
// the cache can only release a key early (Redis then decides), never late.
// It never caches an allow. A cached refusal's Remaining is the
// refusal's; RetryAfter and Reset count down; its At never precedes the
// key's latest decision instant.
//
// # Concurrency
//
// Store, Limiter and Group are safe for concurrent use. Store.Close stops
// everything the store started: its health check, its client and its
// limiters' fallback limiters. (rueidis, the client, closes connections replaced by
// a cluster topology refresh from a goroutine of its own that ends within
// five seconds.)
package redisstore
