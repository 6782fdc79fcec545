package redisstore

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/clientcore"
	"github.com/slidegate/slidegate/internal/redisnames"
)

// The keys whose value is one option's argument, beside the breaker's
// and the TLS client certificate's, which take two keys each.
var (
	durationOptions = map[string]func(time.Duration) Option{
		"timeout": WithTimeout, "dial_timeout": WithDialTimeout, "health_interval": WithHealthInterval,
	}
	fileOptions = map[string]func(string) Option{"tls_ca_file": withTLSCAFile, "tls_server_name": withTLSServerName}
)

// OptionsFromMap turns configuration values (as a YAML decoder produces
// them: strings, ints, floats) into options. Errors name the key; unknown
// keys are errors. "failure" is accepted for "failure_policy". The keys
// are the server's YAML store_options for a redis:// or redis-cluster://
// store:
//
//	store_options:
//	  timeout: 50ms            # per decision round trip (DefaultTimeout)
//	  dial_timeout: 2s         # connecting (DefaultDialTimeout)
//	  failure_policy: local    # local | open | closed (FailLocal)
//	  breaker_threshold: 5     # consecutive failures; 0 disables
//	  breaker_cooldown: 1s
//	  refusal_cache_size: 10000  # 0 disables
//	  key_prefix: "slidegate:"
//	  health_interval: 1s      # slot map and node checks (DefaultHealthInterval)
//	  allow_eviction: false    # accept a maxmemory-policy that evicts keys
//	  tls_ca_file: ""          # rediss://: PEM roots instead of the system's
//	  tls_cert_file: ""        # rediss://: client certificate (mutual TLS)...
//	  tls_key_file: ""         # ...and its key
//	  tls_server_name: ""      # rediss://: name expected in the certificates
//	  sentinel_username: ""    # redis-sentinel://: the sentinels' own user...
//	  sentinel_password: ""    # ...and password (the URL's are the master's)
func OptionsFromMap(m map[string]any) ([]Option, error) {
	var opts []Option
	threshold, cooldown := DefaultBreakerThreshold, DefaultBreakerCooldown
	breaker := false
	var certFile, keyFile string
	var sentinelUser, sentinelPass string
	sentinelSet := false
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := m[k]
		bad := func(want string) error {
			return fmt.Errorf("%w: store_options.%s: %v is not %s", ErrInvalidOption, k, v, want)
		}
		switch k {
		case "allow_eviction":
			b, ok := v.(bool)
			if !ok {
				return nil, bad("true or false")
			}
			if b {
				opts = append(opts, WithEvictionAllowed())
			}
		case "timeout", "dial_timeout", "breaker_cooldown", "health_interval":
			d, ok := toDuration(v)
			if !ok {
				return nil, bad("a duration such as 50ms")
			}
			if with, ok := durationOptions[k]; ok {
				opts = append(opts, with(d))
			} else {
				cooldown, breaker = d, true
			}
		case "failure_policy", "failure":
			s, ok := v.(string)
			if !ok {
				return nil, bad("local, open or closed")
			}
			f, err := parseFailurePolicy(s)
			if err != nil {
				return nil, fmt.Errorf("store_options.%s: %w", k, err)
			}
			opts = append(opts, WithFailurePolicy(f))
		case "breaker_threshold", "refusal_cache_size":
			n, ok := toInt(v)
			if !ok {
				return nil, bad("an integer")
			}
			if k == "breaker_threshold" {
				threshold, breaker = n, true
			} else {
				opts = append(opts, WithRefusalCache(n))
			}
		case "key_prefix":
			s, ok := v.(string)
			if !ok {
				return nil, bad("a string")
			}
			opts = append(opts, WithKeyPrefix(s))
		case "sentinel_username", "sentinel_password":
			s, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("%w: store_options.%s: not a string", ErrInvalidOption, k)
			}
			sentinelSet = true
			if k == "sentinel_username" {
				sentinelUser = s
			} else {
				sentinelPass = s
			}
		case "tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name":
			s, ok := v.(string)
			if !ok || s == "" {
				return nil, bad("a non-empty string")
			}
			switch k {
			case "tls_cert_file":
				certFile = s
			case "tls_key_file":
				keyFile = s
			default:
				opts = append(opts, fileOptions[k](s))
			}
		default:
			return nil, fmt.Errorf("%w: store_options.%s: unknown (known: %s)", ErrInvalidOption, k, strings.Join(redisnames.OptionKeys, ", "))
		}
	}
	if breaker {
		opts = append(opts, WithBreaker(threshold, cooldown))
	}
	if sentinelSet {
		opts = append(opts, WithSentinelAuth(sentinelUser, sentinelPass))
	}
	if certFile != "" || keyFile != "" {
		if certFile == "" || keyFile == "" {
			return nil, fmt.Errorf("%w: store_options: tls_cert_file and tls_key_file go together", ErrInvalidOption)
		}
		opts = append(opts, withTLSClientCert(certFile, keyFile))
	}
	// Apply them once to report errors now, with the key names.
	cfg := defaultConfig()
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("store_options: %w", err)
		}
	}
	return opts, nil
}

// parseFailurePolicy parses "local" (also "" and "fallback"), "open" or
// "closed".
func parseFailurePolicy(s string) (FailurePolicy, error) {
	return clientcore.Parse(s, ErrInvalidOption, "fallback")
}

func toDuration(v any) (time.Duration, bool) {
	switch x := v.(type) {
	case string:
		d, err := time.ParseDuration(strings.TrimSpace(x))
		return d, err == nil
	case time.Duration:
		return x, true
	case int:
		return 0, x == 0
	}
	return 0, false
}

func toInt(v any) (int, bool) {
	switch x := v.(type) {
	case int:
		return x, true
	case int64:
		return int(x), x >= math.MinInt32 && x <= math.MaxInt32
	case uint64:
		return int(x), x <= math.MaxInt32
	case float64:
		return int(x), x == math.Trunc(x) && math.Abs(x) <= math.MaxInt32
	}
	return 0, false
}

// Limiters returns one limiter per policy, in order, owned by the store
// like those of Store.Limiter: the store's Close is the one closer for all
// of them (and for a Group over them, see NewGroup). Two policies whose
// names would share keys are an error. On error the store stays open: its
// opener closes it.
func (s *Store) Limiters(policies []engine.Policy) ([]*Limiter, error) {
	out := make([]*Limiter, 0, len(policies))
	names := map[string]bool{}
	for _, p := range policies {
		l, err := s.Limiter(p)
		if err == nil && names[l.prefix] {
			err = fmt.Errorf("%w: two policies named %q would share keys", engine.ErrInvalidPolicy, p.Name)
		}
		if err != nil {
			return nil, fmt.Errorf("policy %q: %w", p.Name, err)
		}
		names[l.prefix] = true
		out = append(out, l)
	}
	return out, nil
}
