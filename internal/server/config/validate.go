package config

import (
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/httpkit"
	"github.com/slidegate/slidegate/internal/redact"
)

// policyName is what headers, metrics labels and URLs can all carry.
var policyName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// Errorf returns a configuration error (ErrConfig) naming field.
func Errorf(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrConfig, field, fmt.Sprintf(format, args...))
}

// Validate reports the first problem of c, naming the field. LoadConfig,
// ParseConfig and the server's New and Reload run it, so that a
// configuration built in code is checked as one read from YAML is.
func (c Config) Validate() error {
	c = c.WithDefaults()
	for _, check := range []func() error{c.validateListeners, c.validatePolicies, c.validateRequests, c.validateStore, c.validateBounds, c.validateTracing} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// validateListeners checks the addresses and the admin listener's guard.
func (c Config) validateListeners() error {
	if c.Listen != "off" {
		if err := checkAddr("listen", c.Listen); err != nil {
			return err
		}
	}
	if c.Admin != "off" {
		if err := checkAddr("admin", c.Admin); err != nil {
			return err
		}
	}
	return validateAdmin(c)
}

// validatePolicies checks each policy and that default_policy resolves.
func (c Config) validatePolicies() error {
	if len(c.Policies) == 0 {
		return Errorf("policies", "at least one policy is required")
	}
	if err := c.GRPC.validate(); err != nil {
		return err
	}
	switch t := c.TLS; {
	case (t.CertFile == "") != (t.KeyFile == ""):
		return Errorf("tls", "cert_file and key_file go together")
	case t.ClientCAFile != "" && t.CertFile == "":
		return Errorf("tls.client_ca_file", "needs cert_file and key_file: mutual TLS is TLS")
	}
	seen := map[string]bool{}
	for i, pc := range c.Policies {
		if err := pc.validate(i, seen); err != nil {
			return err
		}
		if len(pc.Overrides) > 0 && c.Store != DefaultStore {
			return Errorf(fmt.Sprintf("policies[%d] (%s).overrides", i, pc.Name), "need the memory store; store %s does not take per-key limits (docs/operations.md)", StoreScheme(c.Store))
		}
		seen[pc.Name] = true
	}
	if !c.DefaultPolicy.resolve(seen) {
		return Errorf("default_policy", "%q is not the name of a policy", c.DefaultPolicy)
	}
	return nil
}

// validate checks policy i, whose name must not be in seen.
func (pc PolicyConfig) validate(i int, seen map[string]bool) error {
	f := fmt.Sprintf("policies[%d]", i)
	if !policyName.MatchString(pc.Name) {
		return Errorf(f+".name", "%q must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit", pc.Name)
	}
	f = fmt.Sprintf("policies[%d] (%s)", i, pc.Name)
	if seen[pc.Name] {
		return Errorf(f+".name", "duplicate policy name %q", pc.Name)
	}
	p, err := pc.Policy()
	if err != nil {
		return Errorf(f+".algorithm", "%q is not log or counter", pc.Algorithm)
	}
	if err := p.Validate(); err != nil {
		if pc.Window == 0 {
			return Errorf(f+".window", "missing or zero (want a duration such as 60s)")
		}
		var pe *engine.PolicyError
		if !errors.As(err, &pe) {
			return Errorf(f, "%v", err)
		}
		return Errorf(f+"."+pe.Field, "%s", pe.Reason)
	}
	return pc.validateOverrides(f+".overrides", p.Algorithm)
}

// validateOverrides checks pc's overrides (field names them). An error
// names a key by its digest, as the logs do: a key may be a credential.
func (pc PolicyConfig) validateOverrides(field string, alg engine.Algorithm) error {
	if len(pc.Overrides) > MaxPolicyOverrides {
		return Errorf(field, "%d keys; at most %d (config.MaxPolicyOverrides)", len(pc.Overrides), MaxPolicyOverrides)
	}
	most := engine.MaxLogLimit
	if alg == engine.SlidingCounter {
		most = engine.MaxCounterLimit
	}
	for _, k := range slices.Sorted(maps.Keys(pc.Overrides)) {
		if err := CheckKey("the key", k); err != nil {
			return Errorf(field, "key %s: %v", redact.Key(k), err)
		}
		if l := int(pc.Overrides[k]); l < 1 || l > most {
			return Errorf(field, "key %s: limit %d is outside 1..%d", redact.Key(k), l, most)
		}
	}
	return nil
}

// validateRequests checks how requests are read and passed on: headers,
// trusted proxies, keys, routes, the upstream and the headers dropped
// before it.
func (c Config) validateRequests() error {
	if c.TierHeader != "" && !headerName.MatchString(c.TierHeader) {
		return Errorf("tier_header", "%q is not a header name", c.TierHeader)
	}
	if !headerName.MatchString(c.ClientIPHeader) {
		return Errorf("client_ip_header", "%q is not a header name", c.ClientIPHeader)
	}
	proxies, err := httpkit.ParsePrefixes(c.TrustedProxies)
	if err != nil {
		return Errorf("trusted_proxies", "%v", err)
	}
	for i, p := range proxies {
		if p.Bits() == 0 {
			return Errorf("trusted_proxies", "%q trusts every address: any client could then choose its own key with a forwarding header; list your proxies' addresses", c.TrustedProxies[i])
		}
	}
	if c.IPv6Prefix < 1 || c.IPv6Prefix > 128 {
		return Errorf("ipv6_prefix", "%d is outside 1..128", c.IPv6Prefix)
	}
	if _, err := ParseKeySpec(c.Key, httplimit.ClientIP{TrustedProxies: proxies}, httplimit.Route{}); err != nil {
		return Errorf("key", "%v", err)
	}
	seen := map[string]bool{}
	for _, pc := range c.Policies {
		seen[pc.Name] = true
	}
	if err := c.validateRoutes(seen, httplimit.ClientIP{TrustedProxies: proxies}); err != nil {
		return err
	}
	if c.Upstream != "" {
		if _, err := c.Upstream.Parse(); err != nil {
			return Errorf("upstream", "%v", err)
		}
	}
	for i, h := range c.DropHeaders {
		if !headerName.MatchString(h) {
			return Errorf(fmt.Sprintf("drop_headers[%d]", i), "%q is not a header name", h)
		}
	}
	return nil
}

// validateStore checks the store URL, its options and the policies' key
// caps, which only the memory store has.
func (c Config) validateStore() error {
	if c.StoreFile != "" && c.Store != DefaultStore {
		return Errorf("store_file", "set together with store %q: give the store URL in one of them", redact.URLs(c.Store))
	}
	if c.Store != DefaultStore {
		u, err := url.Parse(c.Store)
		if err != nil || u.Scheme == "" || !strings.Contains(c.Store, "://") {
			shown := redact.URLs(c.Store)
			if at := strings.LastIndexByte(shown, '@'); at >= 0 && !strings.Contains(shown, "://") {
				shown = "xxxxx" + shown[at:] // no scheme to tell a password by
			}
			return Errorf("store", "%q is neither memory nor a URL such as redis://127.0.0.1:6379/0", shown)
		}
	}
	memory := c.Store == DefaultStore && c.StoreFile == ""
	if memory && len(c.StoreOptions) > 0 {
		return Errorf("store_options", "the memory store takes no options (they are for a store URL such as redis://…)")
	}
	for i, pc := range c.Policies {
		f := fmt.Sprintf("policies[%d] (%s)", i, pc.Name)
		switch {
		case pc.MaxKeys < 0:
			return Errorf(f+".max_keys", "%d is negative", pc.MaxKeys)
		case pc.MaxKeys > 0 && !memory:
			return Errorf(f+".max_keys", "applies to the memory store only; bound a Redis store with its maxmemory setting")
		case pc.MaxKeys == 0 && pc.Overflow != "" && !memory: // memory: the default cap's overflow
			return Errorf(f+".overflow", "needs max_keys")
		case pc.Overflow != "" && pc.Overflow != OverflowRefuse && pc.Overflow != OverflowAllow:
			return Errorf(f+".overflow", "%q is not %s or %s", pc.Overflow, OverflowRefuse, OverflowAllow)
		}
	}
	return nil
}

// validateBounds checks the bounds on requests, connections and waits.
func (c Config) validateBounds() error {
	switch {
	case c.MaxBodyBytes < 1 || c.MaxBodyBytes > MaxMaxBodyBytes:
		return Errorf("max_body_bytes", "%d is outside 1..%d", c.MaxBodyBytes, MaxMaxBodyBytes)
	case c.MaxBatch < 1 || c.MaxBatch > MaxMaxBatch:
		return Errorf("max_batch", "%d is outside 1..%d", c.MaxBatch, MaxMaxBatch)
	case c.CheckDenyStatus != 401 && c.CheckDenyStatus != 403 && c.CheckDenyStatus != 429:
		return Errorf("check_deny_status", "%d is not 401, 403 or 429", c.CheckDenyStatus)
	case c.MaxHeaderBytes < MinMaxHeaderBytes || c.MaxHeaderBytes > MaxMaxHeaderBytes:
		return Errorf("max_header_bytes", "%d is outside %d..%d", c.MaxHeaderBytes, MinMaxHeaderBytes, MaxMaxHeaderBytes)
	case c.MaxConns < 1:
		return Errorf("max_conns", "%d is not positive", c.MaxConns)
	case c.ResponseCostHeader != "" && c.Upstream == "":
		return Errorf("response_cost_header", "needs upstream: only the gateway sees responses")
	case c.ResponseCostHeader != "" && !headerName.MatchString(c.ResponseCostHeader):
		return Errorf("response_cost_header", "%q is not a header name", c.ResponseCostHeader)
	case c.TopCounters < 8 || c.TopCounters > MaxTopCounters:
		return Errorf("top_counters", "%d is outside 8..%d", c.TopCounters, MaxTopCounters)
	case c.MaxConnsPerIP < 1:
		return Errorf("max_conns_per_ip", "%d is not positive", c.MaxConnsPerIP)
	case *c.DrainDelay < 0:
		return Errorf("drain_delay", "%v is negative", *c.DrainDelay)
	case c.ShutdownTimeout < 0:
		return Errorf("shutdown_timeout", "%v is negative", c.ShutdownTimeout)
	}
	for _, d := range c.timeouts() {
		if d.v < Duration(MinTimeout) {
			return Errorf(d.field, "%v is shorter than %v: no request could be served", d.v, MinTimeout)
		}
	}
	return nil
}

// timeouts are the waits every request is bounded by, with their keys.
func (c Config) timeouts() []struct {
	field string
	v     Duration
} {
	return []struct {
		field string
		v     Duration
	}{
		{"read_timeout", c.ReadTimeout}, {"idle_timeout", c.IdleTimeout},
		{"write_timeout", c.WriteTimeout}, {"upstream_header_timeout", c.UpstreamHeaderTimeout},
		{"read_header_timeout", c.ReadHeaderTimeout},
	}
}

// headerName is an HTTP header name (an RFC 9110 token).
var headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

// Warnings returns what is legitimate in c but often a mistake: each
// names its field. The server logs them at start-up and on reload;
// slidegate serve --print-config prints them.
func (c Config) Warnings() []string {
	c = c.WithDefaults()
	var out []string
	switch {
	case c.Upstream == "" && c.Headers.Which() != httplimit.HeadersAll && len(c.TrustedProxies) == 0:
		out = append(out, "headers: applies to gateway mode (upstream) only, and to /v1/check, which answers only trusted_proxies (none set); the decision API's header families are decision_headers")
	case c.Upstream != "" && c.DecisionHeaders.Which() != DefaultDecisionHeaders:
		out = append(out, "decision_headers: applies to the decision API only; in gateway mode (upstream) the header families are headers")
	}
	if c.Admin != "off" {
		if host, _, err := net.SplitHostPort(c.Admin); err == nil && !loopback(host) {
			msg := fmt.Sprintf("admin: %s is reachable from the network", c.Admin)
			if c.AdminTokenFile == "" {
				msg += ": /metrics answers anyone who can connect; key operations and /debug/pprof/ answer loopback peers only (set admin_token_file to require a bearer token and use them remotely)"
			} else {
				msg += ": every request but /healthz and /readyz needs the bearer token of admin_token_file"
			}
			out = append(out, msg)
		}
	}
	for _, d := range c.timeouts() {
		if (d.field == "read_timeout" || d.field == "write_timeout" || d.field == "upstream_header_timeout") && d.v < Duration(100*time.Millisecond) {
			out = append(out, fmt.Sprintf("%s: %v is short enough to cut off ordinary clients", d.field, d.v))
		}
	}
	if c.Upstream == "" && len(c.TrustedProxies) == 0 && (c.TierHeader != "" || bool(c.Shadow) || len(c.Routes) > 0) {
		out = append(out, "tier_header, shadow and routes apply to gateway mode (upstream) only, and to /v1/check, which answers only trusted_proxies (none set); POST /v1/allow ignores them")
	}
	for i, rc := range c.Routes {
		if len(rc.Tiers) > 0 && c.TierHeader == "" {
			out = append(out, fmt.Sprintf("routes[%d].tiers: no tier_header is set, so no request can choose a tier: every request gets the route's limits", i))
		}
	}
	return out
}

// loopback reports whether host (of a listen address) is a loopback
// name or address.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil && a.Unmap().IsLoopback()
}

func checkAddr(field, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			err = errors.New(ae.Err)
		}
		return Errorf(field, "%q is not host:port (%v)", addr, err)
	}
	if host != "" && host != "localhost" && net.ParseIP(strings.Trim(host, "[]")) == nil {
		if _, err := url.Parse("http://" + host); err != nil {
			return Errorf(field, "%q has a bad host", addr)
		}
	}
	if port == "" {
		return Errorf(field, "%q has no port", addr)
	}
	return nil
}

// validate checks the grpc section on its own; serve checks the Envoy
// configuration file and the store when it starts the service.
func (g GRPCConfig) validate() error {
	switch {
	case g.Listen == "" && g.EnvoyConfig != "":
		return Errorf("grpc.listen", "missing: grpc.envoy_config needs a gRPC address to serve on")
	case g.Listen != "" && g.EnvoyConfig == "":
		return Errorf("grpc.envoy_config", "missing: the Envoy rate limit service needs its rules (an envoyproxy/ratelimit YAML file or directory)")
	case g.MaxConnections < 0:
		return Errorf("grpc.max_connections", "%d must not be negative", g.MaxConnections)
	case g.MaxKeys < 0:
		return Errorf("grpc.max_keys", "%d must not be negative", g.MaxKeys)
	case g.MaxConnectionIdle < 0:
		return Errorf("grpc.max_connection_idle", "%v must not be negative", g.MaxConnectionIdle)
	case g.MaxConnectionAge < 0:
		return Errorf("grpc.max_connection_age", "%v must not be negative", g.MaxConnectionAge)
	case g.MaxConnectionAgeGrace < 0:
		return Errorf("grpc.max_connection_age_grace", "%v must not be negative", g.MaxConnectionAgeGrace)
	case len(g.ClusterTag) > 256:
		return Errorf("grpc.cluster_tag", "longer than 256 bytes")
	}
	if g.Listen != "" {
		return checkAddr("grpc.listen", g.Listen)
	}
	return nil
}
