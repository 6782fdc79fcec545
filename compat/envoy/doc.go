// Package envoy is the differential test of slidegate's Envoy rate limit
// service against envoyproxy/ratelimit itself: the peer, installed at a
// pinned version from the Go module proxy by peer-env.sh, and slidegate
// read the same configurations and answer the same request sequences over
// loopback gRPC (make test-envoy). It is a module of its own so that the
// peer's test dependencies stay out of slidegate's go.mod.
package envoy
