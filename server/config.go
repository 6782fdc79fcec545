package server

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
)

// Defaults of the configuration, also the flag defaults of slidegate serve.
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
)

//go:embed default.yaml
var defaultYAML []byte

// DefaultYAML returns the embedded default configuration, the one
// slidegate serve runs without --config.
func DefaultYAML() []byte { return bytes.Clone(defaultYAML) }

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
	// TrustedProxies are the CIDR ranges whose X-Forwarded-For and
	// Forwarded headers are believed by the ip key (default none).
	TrustedProxies []string `yaml:"trusted_proxies"`
	// IPv6Prefix groups IPv6 clients (default 64).
	IPv6Prefix int `yaml:"ipv6_prefix"`
	// Store is where state lives: "memory" (DefaultStore), or a URL whose
	// scheme a store factory was registered for (WithStore).
	Store string `yaml:"store"`
	// StoreOptions are handed to the store factory unread.
	StoreOptions map[string]any `yaml:"store_options,omitempty"`
	// Upstream, when set, turns on gateway mode: every request to Listen
	// is decided and, when allowed, proxied to this URL.
	Upstream string `yaml:"upstream"`
	// Shadow decides and counts but never refuses (gateway mode).
	Shadow bool `yaml:"shadow"`
	// Headers switches header families on and off (all on by default).
	Headers HeadersConfig `yaml:"headers"`
	// MaxBodyBytes bounds decision API request bodies
	// (DefaultMaxBodyBytes); larger bodies are answered 413.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxBatch bounds the items of one batch request (DefaultMaxBatch).
	MaxBatch int `yaml:"max_batch"`
	// ShutdownTimeout is how long in-flight requests get to finish after
	// SIGINT/SIGTERM (DefaultShutdownTimeout).
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// ReadTimeout bounds reading one request, headers and body
	// (DefaultReadTimeout); IdleTimeout bounds an idle keep-alive
	// connection (DefaultIdleTimeout).
	ReadTimeout time.Duration `yaml:"read_timeout"`
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// Policies are the tiers; each needs a unique name.
	Policies []PolicyConfig `yaml:"policies"`
}

// HeadersConfig switches the header families. A nil field means on.
type HeadersConfig struct {
	Draft      *bool `yaml:"draft"`       // RateLimit-Policy, RateLimit
	X          *bool `yaml:"x"`           // X-RateLimit-Limit/-Remaining/-Reset
	RetryAfter *bool `yaml:"retry_after"` // Retry-After on 429
}

// Which returns the families as httplimit.Headers.
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
}

// Policy converts pc to an engine.Policy.
func (pc PolicyConfig) Policy() (engine.Policy, error) {
	alg, err := engine.ParseAlgorithm(pc.Algorithm)
	if err != nil {
		return engine.Policy{}, err
	}
	return engine.Policy{Name: pc.Name, Limit: pc.Limit, Window: pc.Window, Algorithm: alg}, nil
}

// DefaultConfig returns the embedded default configuration.
func DefaultConfig() Config {
	c, err := ParseConfig(defaultYAML)
	if err != nil {
		panic("server: embedded default.yaml is invalid: " + err.Error())
	}
	return c
}

// LoadConfig reads and validates a YAML configuration file.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseConfig parses and validates YAML. Unknown keys are errors, so that
// a misspelt key does not silently take its default.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("%w: %s", ErrConfig, yamlErrors.Replace(strings.TrimPrefix(err.Error(), "yaml: ")))
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// yamlErrors turns the Go types in the YAML decoder's messages into the
// names a configuration's author knows.
var yamlErrors = strings.NewReplacer(
	"in type server.Config", "(a top-level key; see slidegate serve --print-config)",
	"in type server.PolicyConfig", "in a policy (want name, limit, window, algorithm)",
	"in type server.HeadersConfig", "in headers (want draft, x, retry_after)",
	"into []server.PolicyConfig", "into policies (a list of {name, limit, window, algorithm})",
	"into server.PolicyConfig", "into a policy (a mapping {name, limit, window, algorithm})",
	"into server.Config", "into the configuration (a mapping of keys)",
	"into server.HeadersConfig", "into headers (a mapping {draft, x, retry_after})",
	"into time.Duration", "into a duration (such as 60s or 1m30s)",
	"into []string", "into a list of strings",
	"field ", "key ",
	"unmarshal errors:\n  ", "",
)

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
	if c.IPv6Prefix == 0 {
		c.IPv6Prefix = httplimit.DefaultIPv6Prefix
	}
	if c.DefaultPolicy == "" && len(c.Policies) > 0 {
		c.DefaultPolicy = c.Policies[0].Name
	}
	on := func(b *bool) *bool {
		if b == nil {
			t := true
			return &t
		}
		return b
	}
	c.Headers = HeadersConfig{Draft: on(c.Headers.Draft), X: on(c.Headers.X), RetryAfter: on(c.Headers.RetryAfter)}
	c.Policies = append([]PolicyConfig(nil), c.Policies...)
	for i := range c.Policies {
		if alg, err := engine.ParseAlgorithm(c.Policies[i].Algorithm); err == nil {
			c.Policies[i].Algorithm = alg.String()
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
			field := ".limit"
			if p.Limit >= 1 && (p.Window <= 0 || p.Window > engine.MaxWindow) {
				field = ".window"
			}
			if pc.Window == 0 {
				return fieldErr(f+".window", "missing or zero (want a duration such as 60s)")
			}
			return fieldErr(f+field, "%s", strings.TrimPrefix(err.Error(), engine.ErrInvalidPolicy.Error()+": "))
		}
	}
	if !seen[c.DefaultPolicy] {
		return fieldErr("default_policy", "%q is not the name of a policy", c.DefaultPolicy)
	}
	if c.TierHeader != "" && strings.ContainsAny(c.TierHeader, " \t:\r\n") {
		return fieldErr("tier_header", "%q is not a header name", c.TierHeader)
	}
	proxies, err := httplimit.ParsePrefixes(c.TrustedProxies)
	if err != nil {
		return fieldErr("trusted_proxies", "%s", strings.TrimPrefix(err.Error(), "httplimit: "))
	}
	if c.IPv6Prefix < 1 || c.IPv6Prefix > 128 {
		return fieldErr("ipv6_prefix", "%d is outside 1..128", c.IPv6Prefix)
	}
	if _, err := httplimit.ParseKeySpec(c.Key, httplimit.ClientIP{TrustedProxies: proxies}); err != nil {
		return fieldErr("key", "%s", strings.TrimPrefix(err.Error(), "httplimit: "))
	}
	if c.Store != DefaultStore {
		u, err := url.Parse(c.Store)
		if err != nil || u.Scheme == "" {
			return fieldErr("store", "%q is neither memory nor a URL such as redis://127.0.0.1:6379/0", c.Store)
		}
	}
	if c.Upstream != "" {
		u, err := url.Parse(c.Upstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fieldErr("upstream", "%q is not an http:// or https:// URL with a host", c.Upstream)
		}
	}
	switch {
	case c.MaxBodyBytes < 0:
		return fieldErr("max_body_bytes", "%d is negative", c.MaxBodyBytes)
	case c.MaxBatch < 0:
		return fieldErr("max_batch", "%d is negative", c.MaxBatch)
	case c.ShutdownTimeout < 0:
		return fieldErr("shutdown_timeout", "%v is negative", c.ShutdownTimeout)
	case c.ReadTimeout < 0:
		return fieldErr("read_timeout", "%v is negative", c.ReadTimeout)
	case c.IdleTimeout < 0:
		return fieldErr("idle_timeout", "%v is negative", c.IdleTimeout)
	}
	return nil
}

func checkAddr(field, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fieldErr(field, "%q is not host:port (%v)", addr, strings.TrimPrefix(err.Error(), "address "+addr+": "))
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
// --print-config).
func (c Config) Marshal() ([]byte, error) { return yaml.Marshal(c.withDefaults()) }
