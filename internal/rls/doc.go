// Package rls is Envoy's rate limit service (envoy.service.ratelimit.v3,
// "RLS") on slidegate's exact sliding windows: a drop-in for
// envoyproxy/ratelimit, which counts fixed windows and so lets a client
// through up to twice its limit across a window boundary.
//
// # Tour
//
// [LoadConfig], [LoadDir] (or [ParseConfig], [ParseConfigs]) read
// envoyproxy/ratelimit's YAML as the pinned peer does: per file a domain
// and a tree of descriptors with key, optional value (a trailing * makes
// it a prefix), rate_limit (unit, requests_per_unit up to 2^32-1,
// unlimited, name, replaces), shadow_mode, quota_mode, share_threshold,
// detailed_metric and value_to_metric. slidegate adds optional keys to
// rate_limit: unit_multiplier, window (any duration, like 90s) and
// algorithm (log, the default and exact, or counter). Files the peer
// refuses are errors that name the file and line; what the peer ignores
// is a warning ([Config.Warnings]).
//
// Each rule with a limit becomes one policy of an engine group
// ([Config.Policies], [Config.NewGroup]). [New] builds the [Service] over
// any [engine.GroupBackend] with those policies; [NewGRPCServer] serves it
// beside grpc.health.v1 and reflection. A [Reloader] reads the
// configuration again when its files change, keeping the state of rules
// that did not ([MemoryBackends]); [HTTPHandler] serves the peer's /json,
// /healthcheck and /rlconfig.
//
// # Decisions
//
// Each descriptor of a request selects at most one rule, as in the peer:
// entry by entry, the child "key_value" beats the first wildcard that
// prefixes it, which beats the child "key"; the rule is the one the last
// entry reaches. The rule's state is keyed by the descriptor's entries,
// so a rule without a value counts every value apart. All the enforced
// rules a request selects are decided at once, all or nothing, each at its
// descriptor's cost (hits_addend; 0 on a descriptor checks without
// charging): a refusal by one charges no other. Shadow and quota rules are
// decided after, among themselves, and only for requests the enforced
// rules let through; they never refuse. The response carries the overall
// code, a status per descriptor (current_limit, limit_remaining, and
// duration_until_reset: the time until the oldest entry leaves the window
// when allowed, the exact wait when refused) and, when asked, the peer's
// RateLimit-Limit/-Remaining/-Reset headers, the IETF draft headers and
// the peer's dynamic_metadata.
//
// Nothing a client can influence is an error: a value of any length (keyed
// by a digest past MaxKeyBytes), any number of descriptors and entries,
// any hits_addend, an unknown domain each get a decision, because Envoy
// lets a request through on an error. Only a request with no domain or no
// descriptors is answered InvalidArgument (and a message gRPC cannot
// decode or larger than DefaultMaxRecvMsgSize, by gRPC), each counted.
//
// docs/envoy.md has the Envoy side and the differences from
// envoyproxy/ratelimit.
//
// A Service is safe for concurrent use.
package rls
