package server

import "github.com/slidegate/slidegate/internal/server/config"

// The configuration lives in package config, which knows nothing of the
// runtime. Its names are repeated here so that the server's callers name
// one package.

// Configuration types (package config).
type (
	Config        = config.Config
	GRPCConfig    = config.GRPCConfig
	TLSConfig     = config.TLSConfig
	HeadersConfig = config.HeadersConfig
	PolicyConfig  = config.PolicyConfig
	RouteConfig   = config.RouteConfig
	LimitConfig   = config.LimitConfig
	TracingConfig = config.TracingConfig
	Duration      = config.Duration
	Int           = config.Int
	Bool          = config.Bool
	ByteSize      = config.ByteSize
	UpstreamURL   = config.UpstreamURL
	PolicyName    = config.PolicyName
)

// Defaults and bounds of the configuration (package config).
const (
	DefaultListen                = config.DefaultListen
	DefaultAdmin                 = config.DefaultAdmin
	DefaultStore                 = config.DefaultStore
	DefaultKey                   = config.DefaultKey
	DefaultMaxBodyBytes          = config.DefaultMaxBodyBytes
	DefaultMaxBatch              = config.DefaultMaxBatch
	DefaultCheckDenyStatus       = config.DefaultCheckDenyStatus
	DefaultShutdownTimeout       = config.DefaultShutdownTimeout
	DefaultReadTimeout           = config.DefaultReadTimeout
	DefaultIdleTimeout           = config.DefaultIdleTimeout
	DefaultWriteTimeout          = config.DefaultWriteTimeout
	DefaultUpstreamHeaderTimeout = config.DefaultUpstreamHeaderTimeout
	DefaultDrainDelay            = config.DefaultDrainDelay
	DefaultMaxHeaderBytes        = config.DefaultMaxHeaderBytes
	DefaultMaxConns              = config.DefaultMaxConns
	DefaultMaxConnsPerIP         = config.DefaultMaxConnsPerIP
	DefaultReadHeaderTimeout     = config.DefaultReadHeaderTimeout
	DefaultClientIPHeader        = config.DefaultClientIPHeader
	DefaultDecisionHeaders       = config.DefaultDecisionHeaders
	DefaultMaxKeys               = config.DefaultMaxKeys
	MaxMaxBodyBytes              = config.MaxMaxBodyBytes
	MaxMaxBatch                  = config.MaxMaxBatch
	MinMaxHeaderBytes            = config.MinMaxHeaderBytes
	MaxMaxHeaderBytes            = config.MaxMaxHeaderBytes
	MinTimeout                   = config.MinTimeout
	MaxLimits                    = config.MaxLimits
	MaxRoutePathLen              = config.MaxRoutePathLen
	MaxPolicyOverrides           = config.MaxPolicyOverrides
	OverflowRefuse               = config.OverflowRefuse
	OverflowAllow                = config.OverflowAllow
)

// ErrConfig is wrapped by every configuration error (config.ErrConfig).
var ErrConfig = config.ErrConfig

// DefaultAdminHosts are admin_hosts' default (config.DefaultAdminHosts).
var DefaultAdminHosts = config.DefaultAdminHosts

// DefaultConfig is config.DefaultConfig.
func DefaultConfig() Config { return config.DefaultConfig() }

// LoadConfig is config.LoadConfig.
func LoadConfig(path string, edits ...func(*Config)) (Config, error) {
	return config.LoadConfig(path, edits...)
}

// ParseConfig is config.ParseConfig.
func ParseConfig(data []byte, edits ...func(*Config)) (Config, error) {
	return config.ParseConfig(data, edits...)
}

// ParseDuration is config.ParseDuration.
func ParseDuration(s string) (Duration, error) { return config.ParseDuration(s) }

// ParseByteSize is config.ParseByteSize.
func ParseByteSize(s string) (ByteSize, error) { return config.ParseByteSize(s) }
