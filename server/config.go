package server

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/httpkit"
	"github.com/slidegate/slidegate/internal/redact"
)

// Defaults of the configuration: the one place they are set. slidegate
// serve's flags take them as their defaults, and the embedded default.yaml
// names only the policies.
const (
	DefaultListen          = "127.0.0.1:8080"
	DefaultAdmin           = "127.0.0.1:9090"
	DefaultStore           = "memory"
	DefaultKey             = "ip"
	DefaultMaxBodyBytes    = 64 << 10
	DefaultMaxBatch        = 100
	DefaultShutdownTimeout = 10 * time.Second
	DefaultReadTimeout     = 30 * time.Second
	DefaultIdleTimeout     = 120 * time.Second
	// DefaultWriteTimeout bounds writing one response, and in gateway mode
	// the whole upstream exchange: a client that stops reading cannot hold
	// a goroutine and an upstream connection for longer.
	DefaultWriteTimeout = 60 * time.Second
	// DefaultUpstreamHeaderTimeout bounds the wait for an upstream's
	// response headers; past it the gateway answers 504.
	DefaultUpstreamHeaderTimeout = 30 * time.Second
	// DefaultDrainDelay is how long /readyz answers 503 after SIGTERM
	// before the listeners close, so that a load balancer stops sending
	// first.
	DefaultDrainDelay = 5 * time.Second
	// DefaultMaxHeaderBytes bounds a request's header block (net/http's
	// own default is 1 MiB).
	DefaultMaxHeaderBytes = 64 << 10
	// DefaultMaxConns bounds the open connections of each listener.
	DefaultMaxConns = 10000
	// DefaultClientIPHeader is the forwarding header the ip key believes
	// from trusted proxies.
	DefaultClientIPHeader = httplimit.DefaultClientIPHeader
	// DefaultDecisionHeaders are the header families of the decision
	// API's answers (decision_headers): the draft's RateLimit-Policy and
	// RateLimit, and Retry-After on refusals. X-RateLimit-* repeats what
	// the draft headers and the JSON body say; it is off unless asked
	// for. The gateway's default (headers) is every family.
	DefaultDecisionHeaders = httplimit.HeaderDraft | httplimit.HeaderRetryAfter
)

// Upper and lower bounds that configuration values are checked against.
const (
	// MaxMaxBodyBytes is the largest max_body_bytes accepted.
	MaxMaxBodyBytes = 64 << 20
	// MaxMaxBatch is the largest max_batch accepted.
	MaxMaxBatch = 10000
	// MinMaxHeaderBytes and MaxMaxHeaderBytes bound max_header_bytes.
	MinMaxHeaderBytes = 1 << 10
	MaxMaxHeaderBytes = 1 << 20
	// MinTimeout is the shortest read, write, idle or upstream timeout
	// accepted: below it no request could be served.
	MinTimeout = time.Millisecond
)

//go:embed default.yaml
var defaultYAML []byte

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("config")

// Config is the server's configuration: a YAML file, overridden by flags.
// Zero values take the defaults documented on each field; Policies is
// required (DefaultConfig has one).
type Config struct {
	// Listen is the address of the decision API or gateway (DefaultListen).
	Listen string `yaml:"listen"`
	// Admin is the address of /metrics, /debug/pprof/, /healthz and
	// /readyz (DefaultAdmin); "off" disables the admin listener.
	Admin string `yaml:"admin"`
	// DefaultPolicy names the policy of requests that name none; empty
	// means the first policy.
	DefaultPolicy string `yaml:"default_policy"`
	// TierHeader names the request header that selects the policy in
	// gateway mode ("" for none: every request gets DefaultPolicy).
	TierHeader string `yaml:"tier_header"`
	// Key is how gateway requests are keyed: "ip", "header:NAME", either
	// followed by "+route" (DefaultKey).
	Key string `yaml:"key"`
	// TrustedProxies are the CIDR ranges whose ClientIPHeader is believed
	// by the ip key (default none).
	TrustedProxies []string `yaml:"trusted_proxies"`
	// ClientIPHeader is the one forwarding header the ip key believes from
	// a trusted proxy (DefaultClientIPHeader): "X-Forwarded-For",
	// "Forwarded" (RFC 7239) or another header holding a comma-separated
	// list, such as "X-Real-IP".
	ClientIPHeader string `yaml:"client_ip_header"`
	// RouteFoldCase makes the +route key case-insensitive ("/A" and "/a"
	// share a limit); by default routes are case-sensitive.
	RouteFoldCase bool `yaml:"route_fold_case"`
	// IPv6Prefix groups IPv6 clients (default 64).
	IPv6Prefix int `yaml:"ipv6_prefix"`
	// Store is where state lives: "memory" (DefaultStore), or a URL whose
	// scheme a store factory was registered for (WithStore). A password
	// in it is never logged or printed; keep it out of the file with
	// StoreFile (or slidegate serve's SLIDEGATE_STORE variable).
	Store string `yaml:"store"`
	// StoreFile names a file holding the store URL (surrounding white
	// space ignored), such as a mounted secret; it excludes Store.
	StoreFile string `yaml:"store_file,omitempty"`
	// StoreOptions are handed to the store factory unread; the memory
	// store takes none.
	StoreOptions map[string]any `yaml:"store_options,omitempty"`
	// Upstream, when set, turns on gateway mode: every request to Listen
	// is decided and, when allowed, proxied to this URL.
	Upstream string `yaml:"upstream"`
	// Shadow decides and counts but never refuses (gateway mode).
	Shadow bool `yaml:"shadow"`
	// Headers switches the gateway's header families on and off (all on
	// by default): a gateway's clients are the end clients, and many read
	// X-RateLimit-*.
	Headers HeadersConfig `yaml:"headers"`
	// DecisionHeaders switches the decision API's header families on and
	// off: RateLimit-Policy and RateLimit (draft) and Retry-After are on by
	// default, X-RateLimit-* (x) off. A nil field takes its default. The
	// decision API's callers are programs that read the JSON body, which
	// carries what the trio says; envoyproxy/ratelimit likewise sends no
	// headers unless asked.
	DecisionHeaders HeadersConfig `yaml:"decision_headers"`
	// MaxBodyBytes bounds decision API request bodies
	// (DefaultMaxBodyBytes); larger bodies are answered 413.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxBatch bounds the items of one batch request (DefaultMaxBatch).
	MaxBatch int `yaml:"max_batch"`
	// MaxHeaderBytes bounds a request's header block on both listeners
	// (DefaultMaxHeaderBytes); larger ones are answered 431.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// MaxConns bounds the open connections of each listener
	// (DefaultMaxConns); further clients wait in the kernel's accept
	// queue until one closes.
	MaxConns int `yaml:"max_conns"`
	// DrainDelay is how long, after SIGTERM, /readyz answers 503 while
	// requests are still served, before the listeners close
	// (DefaultDrainDelay when nil; 0 closes at once). A second signal
	// ends the delay.
	DrainDelay *time.Duration `yaml:"drain_delay"`
	// ShutdownTimeout is how long in-flight requests get to finish once
	// the listeners are closed (DefaultShutdownTimeout).
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// ReadTimeout bounds reading one request, headers and body, on both
	// listeners (DefaultReadTimeout); IdleTimeout bounds an idle
	// keep-alive connection (DefaultIdleTimeout); WriteTimeout bounds
	// writing a response of the main listener, in gateway mode the whole
	// upstream exchange included (DefaultWriteTimeout).
	ReadTimeout  time.Duration `yaml:"read_timeout"`
	IdleTimeout  time.Duration `yaml:"idle_timeout"`
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// UpstreamHeaderTimeout bounds the wait for the upstream's response
	// headers in gateway mode (DefaultUpstreamHeaderTimeout); past it the
	// client gets 504.
	UpstreamHeaderTimeout time.Duration `yaml:"upstream_header_timeout"`
	// Policies are the tiers; each needs a unique name.
	Policies []PolicyConfig `yaml:"policies"`
	// Routes map a method and path prefix to the limits of the requests
	// they match, all decided at once (gateway mode; see RouteConfig). A
	// request no route matches is decided as without routes: the tier
	// header's policy (else DefaultPolicy), keyed by Key.
	Routes []RouteConfig `yaml:"routes,omitempty"`
	// GRPC configures the Envoy rate limit service that slidegate serve
	// runs beside the HTTP listeners (docs/envoy.md); empty: off. serve's
	// --grpc, --envoy-* and --grpc-max-connections flags override its
	// fields. It is read at start: SIGHUP does not change it.
	GRPC GRPCConfig `yaml:"grpc,omitempty"`
}

// GRPCConfig is the grpc section: the Envoy rate limit service (RLS v3).
type GRPCConfig struct {
	// Listen is the gRPC address (--grpc); EnvoyConfig the
	// envoyproxy/ratelimit YAML file or directory (--envoy-config). Each
	// needs the other.
	Listen      string `yaml:"listen,omitempty"`
	EnvoyConfig string `yaml:"envoy_config,omitempty"`
	// EnvoyHeaders adds RateLimit and RateLimit-Policy (and Retry-After on
	// refusals) to Envoy's responses (--envoy-headers).
	EnvoyHeaders bool `yaml:"envoy_headers,omitempty"`
	// MaxConnections bounds the gRPC connections served at once
	// (--grpc-max-connections; 0: 1024).
	MaxConnections int `yaml:"max_connections,omitempty"`
	// MaxKeys caps the keys each Envoy rule tracks on the memory store
	// (--envoy-max-keys; 0: no cap).
	MaxKeys int `yaml:"max_keys,omitempty"`
	// ClusterTag, on Redis Cluster, is the descriptor entry key whose value
	// places every key of a request in one hash slot (--envoy-cluster-tag).
	ClusterTag string `yaml:"cluster_tag,omitempty"`
}

// HeadersConfig switches the header families. A nil field takes its
// default (Config.Headers: all on; Config.DecisionHeaders: all but x).
type HeadersConfig struct {
	Draft      *bool `yaml:"draft"`       // RateLimit-Policy, RateLimit
	X          *bool `yaml:"x"`           // X-RateLimit-Limit/-Remaining/-Reset
	RetryAfter *bool `yaml:"retry_after"` // Retry-After on 429
}

// Which returns the families as httplimit.Headers, a nil field counting as
// on (the defaults of Config.Headers; Config.WithDefaults fills in those of
// DecisionHeaders).
func (h HeadersConfig) Which() httplimit.Headers {
	on := func(b *bool) bool { return b == nil || *b }
	var w httplimit.Headers
	if on(h.Draft) {
		w |= httplimit.HeaderDraft
	}
	if on(h.X) {
		w |= httplimit.HeaderX
	}
	if on(h.RetryAfter) {
		w |= httplimit.HeaderRetryAfter
	}
	return w
}

// PolicyConfig is one policy (tier).
type PolicyConfig struct {
	Name      string        `yaml:"name"`
	Limit     int           `yaml:"limit"`
	Window    time.Duration `yaml:"window"`
	Algorithm string        `yaml:"algorithm"` // log (default) or counter
	// MaxKeys caps the keys the memory store tracks for this policy
	// (0: no cap). When full, a new key is refused (Overflow "refuse",
	// the default: 429 naming the cap) or admitted untracked ("allow");
	// keys already tracked keep their exact limits.
	MaxKeys  int    `yaml:"max_keys,omitempty"`
	Overflow string `yaml:"overflow,omitempty"`
}

// Policy converts pc to an engine.Policy.
func (pc PolicyConfig) Policy() (engine.Policy, error) {
	alg, err := engine.ParseAlgorithm(pc.Algorithm)
	if err != nil {
		return engine.Policy{}, err
	}
	return engine.Policy{Name: pc.Name, Limit: pc.Limit, Window: pc.Window, Algorithm: alg}, nil
}

// DefaultConfig returns the embedded default configuration: its policies
// as written, every other key at its default (the Default* constants).
func DefaultConfig() Config {
	c, err := ParseConfig(defaultYAML)
	if err != nil {
		panic("server: embedded default.yaml is invalid: " + err.Error())
	}
	d := c.withDefaults()
	d.Policies = c.Policies
	return d
}

// LoadConfig reads and validates a YAML configuration file.
func LoadConfig(path string) (Config, error) {
	c, err := ReadConfig(path)
	if err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ReadConfig reads a YAML configuration file as DecodeConfig does,
// without validating it: for callers that override fields (slidegate
// serve's flags) and validate the result.
func ReadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c, err := DecodeConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseConfig parses and validates YAML. Unknown keys are errors, so that
// a misspelt key does not silently take its default.
//
// A file holds one YAML document: a second one (after ---) is an error,
// not silently ignored. Integer keys given a fraction (limit: 2.5) and
// durations without a unit (window: 60) are errors rather than truncated
// or read as nanoseconds.
func ParseConfig(data []byte) (Config, error) {
	c, err := DecodeConfig(data)
	if err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// DecodeConfig is ParseConfig without the validation: the YAML itself is
// checked (unknown keys, fractions for integers, a second document), the
// values are not.
func DecodeConfig(data []byte) (Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var root yaml.Node
	if err := dec.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return Config{}, fmt.Errorf("%w: line %d: a second YAML document (after ---): a configuration is one document", ErrConfig, extra.Line)
	} else if !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := checkScalars(&root); err != nil {
		return Config{}, err
	}
	if err := checkShape(&root, reflect.TypeFor[Config](), "the configuration"); err != nil {
		return Config{}, err
	}
	if root.Kind != 0 {
		// Decode again from the bytes: yaml.Node.Decode does not check
		// for unknown keys.
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
			return Config{}, fmt.Errorf("%w: %w", ErrConfig, err) // checkShape has passed: not expected
		}
	}
	return c, nil
}

// Kinds of scalar configuration values, checked before decoding so that
// a mistake is reported with its key rather than a Go type, and so that
// nothing is truncated or misread.
var (
	integerKeys = map[string]bool{
		"limit": true, "max_keys": true, "max_batch": true, "max_body_bytes": true,
		"max_header_bytes": true, "max_conns": true, "ipv6_prefix": true, "max_connections": true,
	}
	boolKeys = map[string]bool{
		"shadow": true, "route_fold_case": true, "draft": true, "x": true, "retry_after": true, "envoy_headers": true,
	}
	durationKeys = map[string]bool{
		"window": true, "drain_delay": true, "shutdown_timeout": true, "read_timeout": true,
		"write_timeout": true, "idle_timeout": true, "upstream_header_timeout": true,
	}
)

// checkScalars reports a scalar of the wrong kind under a known key: a
// fraction or text where a whole number belongs (the YAML decoder would
// truncate 2.5 to 2), anything but true or false for a switch, and a
// duration without a unit (the decoder would read "60" as 60 ns).
func checkScalars(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
				continue
			}
			bad := func(want string) error {
				return fmt.Errorf("%w: line %d: %s: %q is not %s", ErrConfig, v.Line, k.Value, v.Value, want)
			}
			switch {
			case integerKeys[k.Value] && v.Tag != "!!int":
				return bad("a whole number")
			case boolKeys[k.Value] && v.Tag != "!!bool":
				return bad("true or false")
			case durationKeys[k.Value]:
				if _, err := time.ParseDuration(v.Value); err != nil {
					return bad("a duration with a unit, such as 60s, 1m30s or 24h")
				}
			}
		}
	}
	for i, c := range n.Content {
		if n.Kind == yaml.MappingNode && i%2 == 1 && n.Content[i-1].Value == "store_options" {
			continue // the store's own keys, checked by the store
		}
		if err := checkScalars(c); err != nil {
			return err
		}
	}
	return nil
}

// policyName is what headers, metrics labels and URLs can all carry.
var policyName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

func fieldErr(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrConfig, field, fmt.Sprintf(format, args...))
}

// withDefaults returns c with zero values replaced by their defaults.
func (c Config) withDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.Admin == "" {
		c.Admin = DefaultAdmin
	}
	if c.Key == "" {
		c.Key = DefaultKey
	}
	if c.Store == "" {
		c.Store = DefaultStore
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.UpstreamHeaderTimeout == 0 {
		c.UpstreamHeaderTimeout = DefaultUpstreamHeaderTimeout
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.DrainDelay == nil {
		d := DefaultDrainDelay
		c.DrainDelay = &d
	}
	if c.ClientIPHeader == "" {
		c.ClientIPHeader = DefaultClientIPHeader
	}
	if c.IPv6Prefix == 0 {
		c.IPv6Prefix = httplimit.DefaultIPv6Prefix
	}
	if c.DefaultPolicy == "" && len(c.Policies) > 0 {
		c.DefaultPolicy = c.Policies[0].Name
	}
	or := func(b *bool, def bool) *bool {
		if b == nil {
			return &def
		}
		return b
	}
	c.Headers = HeadersConfig{Draft: or(c.Headers.Draft, true), X: or(c.Headers.X, true), RetryAfter: or(c.Headers.RetryAfter, true)}
	c.DecisionHeaders = HeadersConfig{
		Draft:      or(c.DecisionHeaders.Draft, DefaultDecisionHeaders&httplimit.HeaderDraft != 0),
		X:          or(c.DecisionHeaders.X, DefaultDecisionHeaders&httplimit.HeaderX != 0),
		RetryAfter: or(c.DecisionHeaders.RetryAfter, DefaultDecisionHeaders&httplimit.HeaderRetryAfter != 0),
	}
	c.Policies = append([]PolicyConfig(nil), c.Policies...)
	for i := range c.Policies {
		if alg, err := engine.ParseAlgorithm(c.Policies[i].Algorithm); err == nil {
			c.Policies[i].Algorithm = alg.String()
		}
		if c.Policies[i].MaxKeys > 0 && c.Policies[i].Overflow == "" {
			c.Policies[i].Overflow = OverflowRefuse
		}
	}
	if c.TrustedProxies == nil {
		c.TrustedProxies = []string{}
	}
	return c
}

// WithDefaults returns c with every zero value replaced by its default:
// the configuration a server built from c runs.
func (c Config) WithDefaults() Config { return c.withDefaults() }

// Validate reports the first problem of c, naming the field.
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := checkAddr("listen", c.Listen); err != nil {
		return err
	}
	if c.Admin != "off" {
		if err := checkAddr("admin", c.Admin); err != nil {
			return err
		}
	}
	if len(c.Policies) == 0 {
		return fieldErr("policies", "at least one policy is required")
	}
	if err := c.GRPC.validate(); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i, pc := range c.Policies {
		f := fmt.Sprintf("policies[%d]", i)
		if !policyName.MatchString(pc.Name) {
			return fieldErr(f+".name", "%q must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit", pc.Name)
		}
		f = fmt.Sprintf("policies[%d] (%s)", i, pc.Name)
		if seen[pc.Name] {
			return fieldErr(f+".name", "duplicate policy name %q", pc.Name)
		}
		seen[pc.Name] = true
		p, err := pc.Policy()
		if err != nil {
			return fieldErr(f+".algorithm", "%q is not log or counter", pc.Algorithm)
		}
		if err := p.Validate(); err != nil {
			if pc.Window == 0 {
				return fieldErr(f+".window", "missing or zero (want a duration such as 60s)")
			}
			var pe *engine.PolicyError
			if !errors.As(err, &pe) {
				return fieldErr(f, "%v", err)
			}
			return fieldErr(f+"."+pe.Field, "%s", pe.Reason)
		}
	}
	if !seen[c.DefaultPolicy] {
		return fieldErr("default_policy", "%q is not the name of a policy", c.DefaultPolicy)
	}
	if c.TierHeader != "" && !headerName.MatchString(c.TierHeader) {
		return fieldErr("tier_header", "%q is not a header name", c.TierHeader)
	}
	if !headerName.MatchString(c.ClientIPHeader) {
		return fieldErr("client_ip_header", "%q is not a header name", c.ClientIPHeader)
	}
	proxies, err := httpkit.ParsePrefixes(c.TrustedProxies)
	if err != nil {
		return fieldErr("trusted_proxies", "%v", err)
	}
	for i, p := range proxies {
		if p.Bits() == 0 {
			return fieldErr("trusted_proxies", "%q trusts every address: any client could then choose its own key with a forwarding header; list your proxies' addresses", c.TrustedProxies[i])
		}
	}
	if c.IPv6Prefix < 1 || c.IPv6Prefix > 128 {
		return fieldErr("ipv6_prefix", "%d is outside 1..128", c.IPv6Prefix)
	}
	if _, err := parseKeySpec(c.Key, httplimit.ClientIP{TrustedProxies: proxies}, httplimit.Route{}); err != nil {
		return fieldErr("key", "%v", err)
	}
	if err := c.validateRoutes(seen, httplimit.ClientIP{TrustedProxies: proxies}); err != nil {
		return err
	}
	if c.StoreFile != "" && c.Store != DefaultStore {
		return fieldErr("store_file", "set together with store %q: give the store URL in one of them", redact.URLs(c.Store))
	}
	if c.Store != DefaultStore {
		u, err := url.Parse(c.Store)
		if err != nil || u.Scheme == "" {
			return fieldErr("store", "%q is neither memory nor a URL such as redis://127.0.0.1:6379/0", redact.URLs(c.Store))
		}
	}
	memory := c.Store == DefaultStore && c.StoreFile == ""
	if memory && len(c.StoreOptions) > 0 {
		return fieldErr("store_options", "the memory store takes no options (they are for a store URL such as redis://…)")
	}
	for i, pc := range c.Policies {
		f := fmt.Sprintf("policies[%d] (%s)", i, pc.Name)
		switch {
		case pc.MaxKeys < 0:
			return fieldErr(f+".max_keys", "%d is negative", pc.MaxKeys)
		case pc.MaxKeys > 0 && !memory:
			return fieldErr(f+".max_keys", "applies to the memory store only; bound a Redis store with its maxmemory setting")
		case pc.MaxKeys == 0 && pc.Overflow != "":
			return fieldErr(f+".overflow", "needs max_keys")
		case pc.Overflow != "" && pc.Overflow != OverflowRefuse && pc.Overflow != OverflowAllow:
			return fieldErr(f+".overflow", "%q is not %s or %s", pc.Overflow, OverflowRefuse, OverflowAllow)
		}
	}
	if c.Upstream != "" {
		u, err := url.Parse(c.Upstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fieldErr("upstream", "%q is not an http:// or https:// URL with a host", c.Upstream)
		}
	}
	switch {
	case c.MaxBodyBytes < 1 || c.MaxBodyBytes > MaxMaxBodyBytes:
		return fieldErr("max_body_bytes", "%d is outside 1..%d", c.MaxBodyBytes, MaxMaxBodyBytes)
	case c.MaxBatch < 1 || c.MaxBatch > MaxMaxBatch:
		return fieldErr("max_batch", "%d is outside 1..%d", c.MaxBatch, MaxMaxBatch)
	case c.MaxHeaderBytes < MinMaxHeaderBytes || c.MaxHeaderBytes > MaxMaxHeaderBytes:
		return fieldErr("max_header_bytes", "%d is outside %d..%d", c.MaxHeaderBytes, MinMaxHeaderBytes, MaxMaxHeaderBytes)
	case c.MaxConns < 1:
		return fieldErr("max_conns", "%d is not positive", c.MaxConns)
	case *c.DrainDelay < 0:
		return fieldErr("drain_delay", "%v is negative", *c.DrainDelay)
	case c.ShutdownTimeout < 0:
		return fieldErr("shutdown_timeout", "%v is negative", c.ShutdownTimeout)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"read_timeout", c.ReadTimeout}, {"idle_timeout", c.IdleTimeout},
		{"write_timeout", c.WriteTimeout}, {"upstream_header_timeout", c.UpstreamHeaderTimeout},
	} {
		if d.v < MinTimeout {
			return fieldErr(d.field, "%v is shorter than %v: no request could be served", d.v, MinTimeout)
		}
	}
	return nil
}

// Overflow choices of a policy with max_keys.
const (
	OverflowRefuse = "refuse"
	OverflowAllow  = "allow"
)

// headerName is an HTTP header name (an RFC 9110 token).
var headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

// Warnings returns what is legitimate in c but often a mistake: each
// names its field. The server logs them at start-up and on reload;
// slidegate serve --print-config prints them.
func (c Config) Warnings() []string {
	c = c.withDefaults()
	var out []string
	switch {
	case c.Upstream == "" && c.Headers.Which() != httplimit.HeadersAll:
		out = append(out, "headers: applies to gateway mode (upstream) only; the decision API's header families are decision_headers")
	case c.Upstream != "" && c.DecisionHeaders.Which() != DefaultDecisionHeaders:
		out = append(out, "decision_headers: applies to the decision API only; in gateway mode (upstream) the header families are headers")
	}
	if c.Admin != "off" {
		if host, _, err := net.SplitHostPort(c.Admin); err == nil && !loopback(host) {
			out = append(out, fmt.Sprintf("admin: %s is reachable from the network: /debug/pprof/ and /metrics expose the process's internals to anyone who can connect", c.Admin))
		}
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"read_timeout", c.ReadTimeout}, {"write_timeout", c.WriteTimeout}, {"upstream_header_timeout", c.UpstreamHeaderTimeout},
	} {
		if d.v < 100*time.Millisecond {
			out = append(out, fmt.Sprintf("%s: %v is short enough to cut off ordinary clients", d.field, d.v))
		}
	}
	if c.Upstream == "" && (c.TierHeader != "" || c.Shadow || len(c.TrustedProxies) > 0 || len(c.Routes) > 0) {
		out = append(out, "tier_header, shadow, trusted_proxies and routes apply to gateway mode (upstream) only; the decision API ignores them")
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
		return fieldErr(field, "%q is not host:port (%v)", addr, err)
	}
	if host != "" && host != "localhost" && net.ParseIP(strings.Trim(host, "[]")) == nil {
		if _, err := url.Parse("http://" + host); err != nil {
			return fieldErr(field, "%q has a bad host", addr)
		}
	}
	if port == "" {
		return fieldErr(field, "%q has no port", addr)
	}
	return nil
}

// Marshal renders c, defaults filled in, as YAML (slidegate serve
// --print-config). A password in the store URL is redacted: keep it in
// store_file or the environment.
func (c Config) Marshal() ([]byte, error) {
	c = c.withDefaults()
	c.Store = redact.URLs(c.Store)
	return yaml.Marshal(c)
}

// validate checks the grpc section on its own; serve checks the Envoy
// configuration file and the store when it starts the service.
func (g GRPCConfig) validate() error {
	switch {
	case g.Listen == "" && g.EnvoyConfig != "":
		return fieldErr("grpc.listen", "missing: grpc.envoy_config needs a gRPC address to serve on")
	case g.Listen != "" && g.EnvoyConfig == "":
		return fieldErr("grpc.envoy_config", "missing: the Envoy rate limit service needs its rules (an envoyproxy/ratelimit YAML file or directory)")
	case g.MaxConnections < 0:
		return fieldErr("grpc.max_connections", "%d must not be negative", g.MaxConnections)
	case g.MaxKeys < 0:
		return fieldErr("grpc.max_keys", "%d must not be negative", g.MaxKeys)
	case len(g.ClusterTag) > 256:
		return fieldErr("grpc.cluster_tag", "longer than 256 bytes")
	}
	if g.Listen != "" {
		return checkAddr("grpc.listen", g.Listen)
	}
	return nil
}
