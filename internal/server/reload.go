package server

import (
	"errors"
	"fmt"
	"strings"

	"github.com/slidegate/slidegate/internal/httpkit"
	"github.com/slidegate/slidegate/internal/redact"
	"github.com/slidegate/slidegate/internal/server/config"
)

// ErrReload is wrapped by the errors of Reload.
var ErrReload = errors.New("server: reload")

// Reload replaces the configuration while serving: policies, routes,
// default policy, tier header, keys, trusted proxies, headers, shadow,
// upstream and the decision API's bounds take effect for the next request.
// With the memory store a policy whose name and settings are unchanged
// keeps its limiter, and so its keys' state, and the group that decides
// several limits at once is rebuilt over the kept and new limiters; a
// changed or removed policy's limiter is closed once the requests using it
// are done. Another store (Redis) holds the state itself: Reload asks its
// factory for every policy again and closes the previous Store once the
// requests using it are done. Settings of the listeners, the store and the
// timeouts need a restart: Reload keeps them and logs which differ.
//
// On error (an invalid configuration, a store that cannot make a
// backend, a route of several limits on a store without a group) nothing
// changes: the old configuration keeps serving. Every call is counted in
// slidegate_config_reloads_total.
func (s *Server) Reload(cfg config.Config) error {
	s.reload.Lock()
	defer s.reload.Unlock()
	err := s.reloadLocked(cfg)
	if err != nil {
		s.metrics.reloads.WithLabelValues("failure").Inc()
		s.log.Error("configuration reload failed; the previous configuration keeps serving", "err", redact.URLs(err.Error()))
		return err
	}
	s.metrics.reloads.WithLabelValues("success").Inc()
	return nil
}

// ReloadFrom is Reload of the configuration load returns (slidegate
// serve's SIGHUP: read the file again, apply the flags); an error from
// load counts and logs as a failed reload, and nothing changes.
func (s *Server) ReloadFrom(load func() (config.Config, error)) error {
	cfg, err := load()
	if err != nil {
		s.reload.Lock()
		defer s.reload.Unlock()
		err = fmt.Errorf("%w: %w", ErrReload, err)
		s.metrics.reloads.WithLabelValues("failure").Inc()
		s.log.Error("configuration reload failed; the previous configuration keeps serving", "err", redact.URLs(err.Error()))
		return err
	}
	return s.Reload(cfg)
}

func (s *Server) reloadLocked(cfg config.Config) error {
	s.mu.Lock()
	stopped := s.stopped
	s.mu.Unlock()
	if stopped {
		return fmt.Errorf("%w: the server is shutting down", ErrReload)
	}
	cfg, err := resolveStore(cfg)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrReload, err)
	}
	var restart []string
	keep := func(name string, same bool) {
		if !same {
			restart = append(restart, name)
		}
	}
	keep("listen", cfg.Listen == s.cfg.Listen)
	keep("admin", cfg.Admin == s.cfg.Admin)
	keep("tracing", cfg.Tracing.Same(s.cfg.Tracing))
	keep("store", cfg.Store == s.cfg.Store)
	keep("store_options", fmt.Sprint(cfg.StoreOptions) == fmt.Sprint(s.cfg.StoreOptions))
	keep("read_timeout", cfg.ReadTimeout == s.cfg.ReadTimeout)
	keep("write_timeout", cfg.WriteTimeout == s.cfg.WriteTimeout)
	keep("idle_timeout", cfg.IdleTimeout == s.cfg.IdleTimeout)
	keep("upstream_header_timeout", cfg.UpstreamHeaderTimeout == s.cfg.UpstreamHeaderTimeout)
	keep("max_header_bytes", cfg.MaxHeaderBytes == s.cfg.MaxHeaderBytes)
	keep("max_conns", cfg.MaxConns == s.cfg.MaxConns)
	keep("max_conns_per_ip", cfg.MaxConnsPerIP == s.cfg.MaxConnsPerIP)
	keep("read_header_timeout", cfg.ReadHeaderTimeout == s.cfg.ReadHeaderTimeout)
	keep("tls", cfg.TLS == s.cfg.TLS)
	keep("top_counters", cfg.TopCounters == s.cfg.TopCounters)
	keep("top_raw_keys", cfg.TopRawKeys == s.cfg.TopRawKeys)
	cfg.Listen, cfg.Admin, cfg.Store, cfg.StoreFile, cfg.StoreOptions = s.cfg.Listen, s.cfg.Admin, s.cfg.Store, "", s.cfg.StoreOptions
	cfg.ReadTimeout, cfg.WriteTimeout, cfg.IdleTimeout = s.cfg.ReadTimeout, s.cfg.WriteTimeout, s.cfg.IdleTimeout
	cfg.UpstreamHeaderTimeout, cfg.MaxHeaderBytes, cfg.MaxConns = s.cfg.UpstreamHeaderTimeout, s.cfg.MaxHeaderBytes, s.cfg.MaxConns
	cfg.MaxConnsPerIP, cfg.ReadHeaderTimeout = s.cfg.MaxConnsPerIP, s.cfg.ReadHeaderTimeout
	cfg.TLS = s.cfg.TLS
	cfg.TopCounters, cfg.TopRawKeys = s.cfg.TopCounters, s.cfg.TopRawKeys
	if err := cfg.Validate(); err != nil { // max_keys against the store in force
		return fmt.Errorf("%w: %w", ErrReload, err)
	}
	if s.certs != nil {
		// The files again, first: a renewed certificate that does not
		// load fails the reload, and the one in force keeps serving.
		if err := s.certs.Reload(); err != nil {
			return fmt.Errorf("%w: %w", ErrReload, err)
		}
	}
	old := s.cur.Load()
	st, err := s.build(cfg, old)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrReload, err)
	}
	var retired []*policy
	for _, t := range old.policies {
		if nt, ok := st.byName[t.name]; !ok || nt.backend != t.backend {
			retired = append(retired, t)
		}
	}
	s.cur.Store(st)
	s.mu.Lock()
	cl := s.connLis
	s.mu.Unlock()
	if cl != nil {
		proxies, _ := httpkit.ParsePrefixes(cfg.TrustedProxies)
		cl.SetExempt(exemptProxies(proxies))
	}
	for _, w := range cfg.Warnings() {
		s.log.Warn("configuration: " + w)
	}
	if len(restart) > 0 {
		s.log.Warn("configuration reloaded, but these settings take effect only at restart", "fields", strings.Join(restart, ", "))
	}
	kept := len(old.policies) - len(retired)
	s.log.Info("configuration reloaded", "policies", len(st.policies), "kept", kept, "retired", len(retired), "default_policy", st.def.name)
	// A store other than memory is closed whole, even when its factory
	// handed back the backends in force (they compare equal and so retire
	// nothing): the Store it made for old has references of its own.
	if len(retired) > 0 || old.closeStore != nil {
		s.retired.Add(1)
		go func() {
			defer s.retired.Done()
			old.mu.Lock() // every request that took old is done
			defer old.mu.Unlock()
			s.closeState(old, retired)
		}()
	}
	return nil
}

// closeState closes what st's retired policies hold: the whole store, for a
// store other than memory, else each retired policy's limiter.
func (s *Server) closeState(st *state, retired []*policy) {
	if st.closeStore != nil {
		if err := st.closeStore(); err != nil {
			s.log.Warn("closing store", "err", redact.URLs(err.Error()))
		}
		return
	}
	for _, t := range retired {
		if err := t.backend.Close(); err != nil {
			s.log.Warn("closing backend", "policy", t.name, "err", err)
		}
	}
}
