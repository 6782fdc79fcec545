package config

import (
	_ "embed"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/httpkit"
)

// WithDefaults returns c with zero values replaced by their defaults.
func (c Config) WithDefaults() Config {
	setDefault(&c.Listen, DefaultListen)
	setDefault(&c.Admin, DefaultAdmin)
	setDefault(&c.Key, DefaultKey)
	setDefault(&c.Store, DefaultStore)
	setDefault(&c.MaxBodyBytes, DefaultMaxBodyBytes)
	setDefault(&c.MaxBatch, DefaultMaxBatch)
	setDefault(&c.CheckDenyStatus, DefaultCheckDenyStatus)
	setDefault(&c.ShutdownTimeout, Duration(DefaultShutdownTimeout))
	setDefault(&c.ReadTimeout, Duration(DefaultReadTimeout))
	setDefault(&c.IdleTimeout, Duration(DefaultIdleTimeout))
	setDefault(&c.WriteTimeout, Duration(DefaultWriteTimeout))
	setDefault(&c.UpstreamHeaderTimeout, Duration(DefaultUpstreamHeaderTimeout))
	setDefault(&c.MaxHeaderBytes, DefaultMaxHeaderBytes)
	setDefault(&c.MaxConns, DefaultMaxConns)
	setDefault(&c.TopCounters, DefaultTopCounters)
	setDefault(&c.MaxConnsPerIP, DefaultMaxConnsPerIP)
	setDefault(&c.ReadHeaderTimeout, Duration(DefaultReadHeaderTimeout))
	if c.AdminHosts == nil {
		c.AdminHosts = append([]string(nil), DefaultAdminHosts...)
	}
	if c.DrainDelay == nil {
		d := Duration(DefaultDrainDelay)
		c.DrainDelay = &d
	}
	setDefault(&c.ClientIPHeader, DefaultClientIPHeader)
	setDefault(&c.IPv6Prefix, httpkit.DefaultIPv6Prefix)
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

// setDefault sets *p to def when *p is its type's zero value.
func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}
