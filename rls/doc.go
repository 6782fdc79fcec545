// Package rls is Envoy's rate limit service (envoy.service.ratelimit.v3,
// "RLS") on slidegate's exact sliding windows: a drop-in for
// envoyproxy/ratelimit, which counts fixed windows and so lets a client
// through up to twice its limit across a window boundary.
//
// # Tour
//
// [LoadConfig] (or [ParseConfig]) reads envoyproxy/ratelimit's YAML: per file a
// domain and a tree of descriptors with key, optional value (a trailing *
// makes it a prefix), rate_limit (unit, requests_per_unit, unlimited, name,
// replaces), shadow_mode and detailed_metric. slidegate adds optional keys
// to rate_limit: unit_multiplier, window (any duration, like 90s) and
// algorithm (log, the default and exact, or counter). Unknown keys and bad
// values are errors that name the file and line.
//
// Each rule with a limit becomes one policy of an engine group
// ([Config.Policies], [Config.NewGroup]). [New] builds the [Service] over
// any [engine.GroupBackend] with those policies; [NewGRPCServer] serves it beside
// grpc.health.v1 and reflection.
//
// # Decisions
//
// Each descriptor of a request selects at most one rule: entry by entry,
// a descriptor with the entry's value beats a wildcard value that prefixes
// it, which beats one with the key alone; the rule is the one the last
// entry reaches. The rule's log is keyed by the descriptor's entries, so a
// rule without a value counts every value apart. All the enforced rules a
// request selects are decided at once, all or nothing, at the cost
// hits_addend (0 means 1): a refusal by one charges no other. Shadow rules
// are decided after, among themselves, and only for requests the enforced
// rules let through; they never refuse. The response carries the overall
// code, a status per descriptor (current_limit, limit_remaining, and
// duration_until_reset: the time until the oldest entry leaves the window
// when allowed, the exact wait when refused) and, with WithHeaders, the
// RateLimit and RateLimit-Policy headers of the binding limit.
//
// Every client-controlled part of a request is bounded (MaxDomainLen,
// MaxDescriptors, MaxEntries, MaxKeyLen, MaxValueLen, MaxHitsAddend,
// DefaultMaxRecvMsgSize); a request beyond a bound, with an empty domain,
// no descriptors, an empty descriptor or an empty key is answered
// InvalidArgument, an unknown domain NotFound, and nothing is charged.
//
// docs/envoy.md has the Envoy side and the differences from
// envoyproxy/ratelimit.
//
// A Service is safe for concurrent use.
package rls
