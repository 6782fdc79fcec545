package config

import (
	_ "embed"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/httpkit"
)

// WithDefaults returns c with zero values replaced by their defaults.
func (c Config) WithDefaults() Config {
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
	if c.CheckDenyStatus == 0 {
		c.CheckDenyStatus = DefaultCheckDenyStatus
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = Duration(DefaultShutdownTimeout)
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = Duration(DefaultReadTimeout)
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = Duration(DefaultIdleTimeout)
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = Duration(DefaultWriteTimeout)
	}
	if c.UpstreamHeaderTimeout == 0 {
		c.UpstreamHeaderTimeout = Duration(DefaultUpstreamHeaderTimeout)
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.TopCounters == 0 {
		c.TopCounters = DefaultTopCounters
	}
	if c.MaxConnsPerIP == 0 {
		c.MaxConnsPerIP = DefaultMaxConnsPerIP
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = Duration(DefaultReadHeaderTimeout)
	}
	if c.AdminHosts == nil {
		c.AdminHosts = append([]string(nil), DefaultAdminHosts...)
	}
	if c.DrainDelay == nil {
		d := Duration(DefaultDrainDelay)
		c.DrainDelay = &d
	}
	if c.ClientIPHeader == "" {
		c.ClientIPHeader = DefaultClientIPHeader
	}
	if c.IPv6Prefix == 0 {
		c.IPv6Prefix = httpkit.DefaultIPv6Prefix
	}
	if c.DefaultPolicy == "" && len(c.Policies) > 0 {
		c.DefaultPolicy = PolicyName(c.Policies[0].Name)
	}
	or := func(b *Bool, def bool) *Bool {
		if b == nil {
			v := Bool(def)
			return &v
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
