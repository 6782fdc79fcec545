// Package redisnames holds the names the Redis store accepts and the
// project's command registers: the schemes of store URLs and the keys of
// store_options. Users of redisstore do not call it.
package redisnames

// Schemes are the schemes of the store URLs redisstore.Open accepts.
var Schemes = []string{"redis", "rediss", "unix", "redis-cluster", "rediss-cluster", "redis-sentinel", "rediss-sentinel",
	"valkey", "valkeys", "valkey-cluster", "valkeys-cluster", "valkey-sentinel", "valkeys-sentinel"}

// OptionKeys are the keys redisstore.OptionsFromMap accepts.
var OptionKeys = []string{"sentinel_username", "sentinel_password", "timeout", "dial_timeout", "failure_policy", "breaker_threshold", "breaker_cooldown", "refusal_cache_size", "key_prefix", "health_interval", "allow_eviction", "tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name"}
