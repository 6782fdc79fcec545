package config

import (
	_ "embed"
	"errors"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/httpkit"
	"github.com/slidegate/slidegate/internal/topk"
)

// Defaults of the configuration: the one place they are set. slidegate
// serve's flags take them as their defaults, and the embedded default.yaml
// names only the policies.
const (
	DefaultListen       = "127.0.0.1:8080"
	DefaultAdmin        = "127.0.0.1:9090"
	DefaultStore        = "memory"
	DefaultKey          = "ip"
	DefaultMaxBodyBytes = 64 << 10
	DefaultMaxBatch     = 100
	// DefaultCheckDenyStatus is the status of /v1/check's refusals.
	DefaultCheckDenyStatus = 429
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
	// DefaultMaxConnsPerIP bounds the main listener's connections from
	// one client address: a browser opens 6 per host, so 100 leaves room
	// for a small office behind one NAT address.
	DefaultMaxConnsPerIP = 100
	// DefaultReadHeaderTimeout bounds reading a request's headers: a
	// client's headers arrive in one round trip, so 5 s frees the slot of
	// a connection that never finishes them (slowloris) soon.
	DefaultReadHeaderTimeout = 5 * time.Second
	// DefaultClientIPHeader is the forwarding header the ip key believes
	// from trusted proxies.
	DefaultClientIPHeader = httpkit.DefaultClientIPHeader
	// DefaultDecisionHeaders are the header families of the decision
	// API's answers (decision_headers): Retry-After on refusals only.
	// The JSON body carries what the draft pair and the X-RateLimit-*
	// trio would say of the decision (the window is the policy's), and
	// the decision API's callers are programs that read it. Each header costs net/http work on every
	// answer. A caller that forwards them turns them on (draft: true).
	// The gateway's default (headers) is every family.
	DefaultDecisionHeaders = httplimit.HeaderRetryAfter
	// DefaultMaxKeys caps the keys each policy of the memory store tracks
	// when max_keys is not set: a flood of distinct keys with one request
	// each cannot take more than about 150 MB per policy
	// (docs/operations.md, "Memory"), and a new key beyond it is refused
	// (overflow "refuse"), so that the flood gets no free pass.
	DefaultMaxKeys = 1_000_000
)

// Upper and lower bounds that configuration values are checked against.
const (
	// DefaultTopCounters is top_counters' default: counters per minute
	// over every policy (internal/topk states the error).
	DefaultTopCounters = topk.DefaultCounters
	// MaxTopCounters bounds top_counters. A counter takes 196 bytes
	// (room for two: 56 bytes each, four 16-byte index cells, two 8-byte
	// counts to sort, 32 bits of the door), so 65,536 of them in each of
	// the five minutes come to 64 MB, plus the keys.
	MaxTopCounters = 1 << 16
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
	DefaultPolicy PolicyName `yaml:"default_policy"`
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
	RouteFoldCase Bool `yaml:"route_fold_case"`
	// IPv6Prefix groups IPv6 clients (default 64).
	IPv6Prefix Int `yaml:"ipv6_prefix"`
	// Store is where state lives: "memory" (DefaultStore), or a URL whose
	// scheme a store factory was registered for (server.WithStore). A
	// password in it is never logged or printed; keep it out of the file
	// with StoreFile (or slidegate serve's SLIDEGATE_STORE variable).
	Store string `yaml:"store"`
	// StoreFile names a file holding the store URL (surrounding white
	// space ignored), such as a mounted secret; it excludes Store.
	StoreFile string `yaml:"store_file"`
	// StoreOptions are handed to the store factory unread; the memory
	// store takes none.
	StoreOptions map[string]any `yaml:"store_options"`
	// Upstream, when set, turns on gateway mode: every request to Listen
	// is decided and, when allowed, proxied to this URL.
	Upstream UpstreamURL `yaml:"upstream"`
	// Shadow decides and counts but never refuses (gateway mode).
	Shadow Bool `yaml:"shadow"`
	// CheckDenyStatus is the status /v1/check refuses with
	// (DefaultCheckDenyStatus): 401 or 403 for nginx's auth_request, which
	// takes no other refusal from its subrequest, else 429.
	CheckDenyStatus Int `yaml:"check_deny_status"`
	// Headers switches the gateway's header families on and off (all on
	// by default): a gateway's clients are the end clients, and many read
	// X-RateLimit-*.
	Headers HeadersConfig `yaml:"headers"`
	// DecisionHeaders switches the decision API's header families on and
	// off: Retry-After is on by default, RateLimit-Policy and RateLimit
	// (draft) and X-RateLimit-* (x) off. A nil field takes its default.
	// The decision API's callers are programs that read the JSON body,
	// which carries what both families say of the decision;
	// envoyproxy/ratelimit likewise sends no headers unless asked.
	DecisionHeaders HeadersConfig `yaml:"decision_headers"`
	// MaxBodyBytes bounds decision API request bodies
	// (DefaultMaxBodyBytes); larger bodies are answered 413.
	MaxBodyBytes ByteSize `yaml:"max_body_bytes"`
	// MaxBatch bounds the items of one batch request (DefaultMaxBatch).
	MaxBatch Int `yaml:"max_batch"`
	// MaxHeaderBytes bounds a request's header block on both listeners
	// (DefaultMaxHeaderBytes); larger ones are answered 431.
	MaxHeaderBytes ByteSize `yaml:"max_header_bytes"`
	// MaxConns bounds the open connections of each listener
	// (DefaultMaxConns); further clients wait in the kernel's accept
	// queue until one closes.
	MaxConns Int `yaml:"max_conns"`
	// MaxConnsPerIP bounds the main and gRPC listeners' connections from
	// one client address (DefaultMaxConnsPerIP; IPv6 clients by their
	// ipv6_prefix network), lowered to half of MaxConns so that one
	// address can never hold the listener. A connection over it closes
	// the address's oldest idle keep-alive connection; with none idle it
	// waits, holding no slot, until one of the address's closes (as many
	// may wait as the cap; one more is closed at once). Addresses in
	// TrustedProxies are exempt: their connections
	// carry many clients. Near MaxConns (7/8 of it), every new connection
	// closes the listener's oldest idle one.
	MaxConnsPerIP Int `yaml:"max_conns_per_ip"`
	// DrainDelay is how long, after SIGTERM, /readyz answers 503 while
	// requests are still served, before the listeners close
	// (DefaultDrainDelay when nil; 0 closes at once). A second signal
	// ends the delay.
	DrainDelay *Duration `yaml:"drain_delay"`
	// ShutdownTimeout is how long in-flight requests get to finish once
	// the listeners are closed (DefaultShutdownTimeout).
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`
	// ReadTimeout bounds reading one request, headers and body, on both
	// listeners (DefaultReadTimeout); IdleTimeout bounds an idle
	// keep-alive connection (DefaultIdleTimeout); WriteTimeout bounds
	// writing a response of the main listener, in gateway mode the whole
	// upstream exchange included (DefaultWriteTimeout).
	ReadTimeout Duration `yaml:"read_timeout"`
	// ReadHeaderTimeout bounds reading a request's headers on both
	// listeners (DefaultReadHeaderTimeout, and at most ReadTimeout).
	ReadHeaderTimeout Duration `yaml:"read_header_timeout"`
	IdleTimeout       Duration `yaml:"idle_timeout"`
	WriteTimeout      Duration `yaml:"write_timeout"`
	// UpstreamHeaderTimeout bounds the wait for the upstream's response
	// headers in gateway mode (DefaultUpstreamHeaderTimeout); past it the
	// client gets 504.
	UpstreamHeaderTimeout Duration `yaml:"upstream_header_timeout"`
	// AdminHosts are the Host header values the admin listener answers
	// (DefaultAdminHosts, and the host of Admin itself, or, when Admin
	// listens on every address, the machine's interface addresses): host
	// names, IP addresses or CIDR ranges, any port; "*" answers every Host. Another
	// Host is refused with 403, so that a web page whose name an attacker
	// points at the admin address (DNS rebinding) cannot reset or read
	// keys. /healthz and /readyz answer every Host.
	AdminHosts []string `yaml:"admin_hosts"`
	// AdminTokenFile names a file holding a bearer token (surrounding
	// white space ignored): when set, every admin request but /healthz and
	// /readyz needs "Authorization: Bearer TOKEN" (else 401). It is read at
	// start and on every reload. Without it, key operations and pprof
	// answer loopback peers only (403 to others).
	AdminTokenFile string `yaml:"admin_token_file"`
	// ResponseCostHeader, in gateway mode, charges each request no route
	// matches by what the upstream's response says it cost: the response
	// header or trailer of this name holds the whole cost, and the rest
	// beyond the arrival cost is charged when the response ends
	// (httplimit.WithResponseCost; docs/semantics.md). It needs the
	// memory store and sliding-log policies. Empty: off.
	ResponseCostHeader string `yaml:"response_cost_header"`
	// TopCounters is how many counters per minute the view of the keys
	// refused most keeps, over every policy (GET /admin/top, slidegate
	// top; DefaultTopCounters, at most MaxTopCounters). Read at start.
	TopCounters Int `yaml:"top_counters"`
	// TopRawKeys shows the keys themselves in that view; by default they
	// are shown as the logs show them (sha256:…), since a key may be a
	// credential.
	TopRawKeys Bool `yaml:"top_raw_keys"`
	// DropHeaders are request headers the gateway removes before the
	// upstream, besides DefaultDropHeaders.
	DropHeaders []string `yaml:"drop_headers"`
	// Policies are the limits and windows requests are decided against;
	// each needs a unique name. With tier_header, each is a tier a caller's
	// plan can choose.
	Policies []PolicyConfig `yaml:"policies"`
	// Routes map a method and path prefix to the limits of the requests
	// they match, all decided at once (gateway mode; see RouteConfig). A
	// request no route matches is decided as without routes: the tier
	// header's policy (else DefaultPolicy), keyed by Key.
	Routes []RouteConfig `yaml:"routes"`
	// GRPC configures the Envoy rate limit service that slidegate serve
	// runs beside the HTTP listeners (docs/envoy.md); empty: off. serve's
	// --grpc, --envoy-* and --grpc-max-connections flags override its
	// fields. It is read at start: SIGHUP does not change it.
	GRPC GRPCConfig `yaml:"grpc"`
	// TLS, with CertFile and KeyFile, serves the main listener and the
	// gRPC listener over TLS; the admin listener stays plain HTTP (probes,
	// Prometheus). The files are read again on every reload (SIGHUP), so
	// that a renewed certificate takes effect without a restart; their
	// names need one.
	TLS TLSConfig `yaml:"tls"`
	// Tracing sends OpenTelemetry spans to an OTLP endpoint (off by
	// default); see TracingConfig.
	Tracing TracingConfig `yaml:"tracing"`
}

// GRPCConfig is the grpc section: the Envoy rate limit service (RLS v3).
type GRPCConfig struct {
	// Listen is the gRPC address (--grpc); EnvoyConfig the
	// envoyproxy/ratelimit YAML file or directory (--envoy-config). Each
	// needs the other.
	Listen      string `yaml:"listen"`
	EnvoyConfig string `yaml:"envoy_config"`
	// EnvoyHeaders adds RateLimit and RateLimit-Policy (and Retry-After on
	// refusals) to Envoy's responses (--envoy-headers).
	EnvoyHeaders Bool `yaml:"envoy_headers"`
	// MaxConnections bounds the gRPC connections served at once
	// (--grpc-max-connections; 0: 1024).
	MaxConnections Int `yaml:"max_connections"`
	// MaxKeys caps the keys each Envoy rule tracks on the memory store
	// (--envoy-max-keys; 0: DefaultMaxKeys); a new key beyond it is
	// OVER_LIMIT.
	// Marshal prints it on the memory store only: Redis has no key cap.
	MaxKeys Int `yaml:"max_keys,omitempty"`
	// MaxConnectionIdle closes a connection with no call in flight for
	// this long, MaxConnectionAge asks every connection to go away after
	// this long, and MaxConnectionAgeGrace is how long its calls then
	// have (--grpc-max-connection-idle, -age, -age-grace; 0: the rls
	// package's defaults, 5m, 24h and 1h).
	MaxConnectionIdle     Duration `yaml:"max_connection_idle"`
	MaxConnectionAge      Duration `yaml:"max_connection_age"`
	MaxConnectionAgeGrace Duration `yaml:"max_connection_age_grace"`
	// ClusterTag, on Redis Cluster, is the descriptor entry key whose value
	// places every key of a request in one hash slot (--envoy-cluster-tag).
	ClusterTag string `yaml:"cluster_tag"`
	// MaxCallsPerAddress bounds the calls in flight from one client
	// address, streams included (--grpc-max-calls-per-address; 0: 2048);
	// CallTimeout bounds a unary call from its headers to its answer
	// (--grpc-call-timeout; 0: 10s).
	MaxCallsPerAddress Int      `yaml:"max_calls_per_address"`
	CallTimeout        Duration `yaml:"call_timeout"`
}

// TLSConfig names PEM files: the certificate chain and its key, and
// optionally the CAs whose certificates clients must present (mutual
// TLS: a client without one is refused at the handshake).
type TLSConfig struct {
	CertFile     string `yaml:"cert_file"`
	KeyFile      string `yaml:"key_file"`
	ClientCAFile string `yaml:"client_ca_file"`
}

// HeadersConfig switches the header families. A nil field takes its
// default (Config.Headers: all on; Config.DecisionHeaders: all but x).
type HeadersConfig struct {
	Draft      *Bool `yaml:"draft"`       // RateLimit-Policy, RateLimit
	X          *Bool `yaml:"x"`           // X-RateLimit-Limit/-Remaining/-Reset
	RetryAfter *Bool `yaml:"retry_after"` // Retry-After on 429
}

// Which returns the families as httplimit.Headers, a nil field counting as
// on (the defaults of Config.Headers; ParseConfig fills in those of
// DecisionHeaders).
func (h HeadersConfig) Which() httplimit.Headers {
	on := func(b *Bool) bool { return b == nil || bool(*b) }
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

// PolicyConfig is one policy: a limit and a window.
type PolicyConfig struct {
	Name      string   `yaml:"name"`
	Limit     Int      `yaml:"limit"`
	Window    Duration `yaml:"window"`
	Algorithm string   `yaml:"algorithm"` // log (default) or counter
	// MaxKeys caps the keys the memory store tracks for this policy
	// (0: DefaultMaxKeys, which --print-config writes out). When full, a new key is refused (Overflow "refuse",
	// the default: 429 naming the cap) or admitted untracked ("allow");
	// keys already tracked keep their exact limits.
	MaxKeys  Int    `yaml:"max_keys,omitempty"`
	Overflow string `yaml:"overflow,omitempty"`
	// Overrides give keys a limit of their own in the policy's window:
	// each key, as the policy decides it, to its limit (1 to the
	// algorithm's largest limit). A reload that changes them keeps every
	// key's state (docs/semantics.md). At most MaxPolicyOverrides keys,
	// each a valid key (1 to httplimit.MaxKeyLen bytes of UTF-8); the
	// memory store only.
	Overrides map[string]Int `yaml:"overrides,omitempty"`
}

// MaxPolicyOverrides bounds the keys of one policy's overrides. Every
// decision of a policy with overrides looks its key up in them.
const MaxPolicyOverrides = 10_000

// OverrideLimits returns pc's overrides as the engine takes them; nil
// for none.
func (pc PolicyConfig) OverrideLimits() map[string]int {
	if len(pc.Overrides) == 0 {
		return nil
	}
	m := make(map[string]int, len(pc.Overrides))
	for k, l := range pc.Overrides {
		m[k] = int(l)
	}
	return m
}

// SameBut reports whether pc and o run the same but for their overrides,
// which a policy's limiter takes in place. TestPolicyConfigFields fails
// when PolicyConfig gains a field this does not compare.
func (pc PolicyConfig) SameBut(o PolicyConfig) bool {
	a, b := pc.WithKeyCap(), o.WithKeyCap()
	return a.Name == b.Name && a.Limit == b.Limit && a.Window == b.Window && a.Algorithm == b.Algorithm &&
		a.MaxKeys == b.MaxKeys && a.Overflow == b.Overflow
}

// Policy converts pc to an engine.Policy.
func (pc PolicyConfig) Policy() (engine.Policy, error) {
	alg, err := engine.ParseAlgorithm(pc.Algorithm)
	if err != nil {
		return engine.Policy{}, err
	}
	return engine.Policy{Name: pc.Name, Limit: int(pc.Limit), Window: time.Duration(pc.Window), Algorithm: alg}, nil
}

// Overflow choices of a policy with max_keys.
const (
	OverflowRefuse = "refuse"
	OverflowAllow  = "allow"
)
