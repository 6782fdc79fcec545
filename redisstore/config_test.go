package redisstore

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestOptionsFromMap(t *testing.T) {
	opts, err := OptionsFromMap(map[string]any{
		"timeout": "20ms", "dial_timeout": "1s", "failure_policy": "closed", "breaker_threshold": 7,
		"breaker_cooldown": "3s", "refusal_cache_size": 100.0, "key_prefix": "p:",
		"health_interval": "250ms", "allow_eviction": true,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.timeout != 20*time.Millisecond || cfg.dialTimeout != time.Second || cfg.failure != FailClosed ||
		cfg.threshold != 7 || cfg.cooldown != 3*time.Second || cfg.cacheSize != 100 || cfg.prefix != "p:" ||
		cfg.healthInterval != 250*time.Millisecond || !cfg.allowEviction {
		t.Errorf("config %+v", cfg)
	}
	for _, c := range []struct {
		m    map[string]any
		want string
	}{
		{map[string]any{"bogus": 1}, "store_options.bogus: unknown"},
		{map[string]any{"timeout": 5}, "store_options.timeout"},
		{map[string]any{"timeout": "-1s"}, "timeout -1s must be positive"},
		{map[string]any{"failure": "sometimes"}, "store_options.failure"},
		{map[string]any{"breaker_threshold": 1.5}, "store_options.breaker_threshold"},
		{map[string]any{"refusal_cache_size": "big"}, "store_options.refusal_cache_size"},
		{map[string]any{"key_prefix": "{x}"}, "brace"},
		{map[string]any{"allow_eviction": "yes"}, "store_options.allow_eviction"},
		{map[string]any{"health_interval": "0s"}, "health interval 0s must be positive"},
		{map[string]any{"tls_cert_file": "client.pem"}, "tls_cert_file and tls_key_file go together"},
		{map[string]any{"tls_ca_file": 5}, "store_options.tls_ca_file"},
		{map[string]any{"tls_server_name": ""}, "store_options.tls_server_name"},
	} {
		_, err := OptionsFromMap(c.m)
		if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.m, err, c.want)
		}
	}
}
