package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/redact"
	"github.com/slidegate/slidegate/internal/server/config"
	"github.com/slidegate/slidegate/internal/tlsfiles"
)

// StoreSpec is what a StoreFactory is given: the store URL of the
// configuration, its store_options, the policies to make backends for (in
// configuration order), the clock the caller injected (nil for the
// backend's own), the server's registry for the store's own metrics, and
// its logger.
type StoreSpec struct {
	URL        string
	Options    map[string]any
	Policies   []engine.Policy
	Clock      engine.Clock
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Store is what a StoreFactory makes for a configuration's policies.
type Store struct {
	// Backends holds one backend per policy of the spec, in order.
	Backends []engine.Backend
	// Group decides over any subset of those policies (Ref.Policy indexes
	// Backends), all or nothing, sharing their state; nil if the store
	// cannot. A configuration with a route of two or more limits needs
	// it, and so do decision API requests naming several limits.
	Group engine.GroupBackend
	// Close releases everything the factory made; the server calls it
	// once, after the last request that uses the store.
	Close func() error
}

// StoreFactory makes the backends of spec's policies in one store. The
// server calls it at start-up and on every reload (the state lives in the
// store, so that a reload loses none of it), and closes the Store once no
// request uses it any more.
type StoreFactory func(ctx context.Context, spec StoreSpec) (Store, error)

// Check runs New's checks of cfg with opts without building anything or
// connecting to a store: the configuration itself, the store_file, whether
// a store factory serves the store URL's scheme, the TLS files and the
// admin token file. It returns the configuration New would run
// (defaults filled in, the store URL read from store_file) and its
// warnings. slidegate serve --print-config prints what it returns.
func Check(cfg config.Config, opts ...Option) (config.Config, []string, error) {
	var o options
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	cfg, warnings, err := check(cfg, &o)
	if err != nil {
		return config.Config{}, nil, err
	}
	// The files New reads besides the configuration, so that what Check
	// accepts New does not refuse for them.
	if t := cfg.TLS; t.CertFile != "" {
		if _, err := tlsfiles.Load(tlsfiles.Files{Cert: t.CertFile, Key: t.KeyFile, ClientCA: t.ClientCAFile}); err != nil {
			return config.Config{}, nil, fmt.Errorf("%w: %w", config.ErrConfig, err)
		}
	}
	if _, err := newAdminGuard(cfg); err != nil {
		return config.Config{}, nil, err
	}
	return cfg, warnings, nil
}

// check is Check with the options applied.
func check(cfg config.Config, o *options) (config.Config, []string, error) {
	cfg, err := resolveStore(cfg)
	if err != nil {
		return config.Config{}, nil, err
	}
	if cfg.Store != config.DefaultStore {
		u, _ := url.Parse(cfg.Store)
		if _, ok := o.stores[strings.ToLower(u.Scheme)]; !ok {
			known := []string{"memory"}
			for k := range o.stores {
				known = append(known, k+"://")
			}
			sort.Strings(known[1:])
			return config.Config{}, nil, config.Errorf("store", "no backend for %q in this build (known: %s)", u.Scheme+"://", strings.Join(known, ", "))
		}
	}
	return cfg, cfg.Warnings(), nil
}

// resolveStore validates cfg and, when StoreFile is set, reads the store
// URL from it.
func resolveStore(cfg config.Config) (config.Config, error) {
	if err := cfg.Validate(); err != nil {
		return config.Config{}, err
	}
	cfg = cfg.WithDefaults()
	if cfg.StoreFile == "" {
		return cfg, nil
	}
	b, err := os.ReadFile(cfg.StoreFile)
	if err != nil {
		return config.Config{}, config.Errorf("store_file", "%v", err)
	}
	if strings.TrimSpace(string(b)) == "" {
		return config.Config{}, config.Errorf("store_file", "%s is empty", cfg.StoreFile)
	}
	cfg.Store, cfg.StoreFile = strings.TrimSpace(string(b)), ""
	if err := cfg.Validate(); err != nil {
		return config.Config{}, fmt.Errorf("store_file: %w", err)
	}
	return cfg, nil
}

// makeStore makes the backends of pcs, in order, in the store of cfg. The
// memory store makes one engine.Limiter per policy, all on the server's
// one clock (so that NewGroupOf can combine them), and no group: build
// makes it over the policies it keeps too.
func (s *Server) makeStore(cfg config.Config, pcs []config.PolicyConfig) (Store, error) {
	policies := make([]engine.Policy, len(pcs))
	for i, pc := range pcs {
		p, err := pc.Policy()
		if err != nil {
			return Store{}, err // Validate has checked
		}
		policies[i] = p
	}
	if cfg.Store == config.DefaultStore {
		var out []engine.Backend
		closeAll := func() error {
			var errs []error
			for _, b := range out {
				errs = append(errs, b.Close())
			}
			return errors.Join(errs...)
		}
		for i, p := range policies {
			l, err := engine.New(p, s.engineOptions(pcs[i])...)
			if err != nil {
				_ = closeAll()
				return Store{}, fmt.Errorf("server: policy %q: %w", p.Name, err)
			}
			out = append(out, l)
		}
		return Store{Backends: out, Close: closeAll}, nil
	}
	u, _ := url.Parse(cfg.Store)
	f := s.opts.stores[strings.ToLower(u.Scheme)] // check has found it
	store, err := f(context.Background(), StoreSpec{
		URL: cfg.Store, Options: cfg.StoreOptions, Policies: policies,
		Clock: s.opts.clock, Registerer: s.reg, Logger: s.log,
	})
	if err != nil {
		return Store{}, fmt.Errorf("%w: store: %s", config.ErrConfig, redact.URLs(err.Error()))
	}
	if store.Close == nil {
		bs := store.Backends
		store.Close = func() error {
			var errs []error
			for _, b := range bs {
				errs = append(errs, b.Close())
			}
			return errors.Join(errs...)
		}
	}
	if len(store.Backends) != len(policies) {
		_ = store.Close()
		return Store{}, fmt.Errorf("server: store made %d backends for %d policies", len(store.Backends), len(policies))
	}
	return store, nil
}

// engineOptions are the in-memory engine's options for one policy.
func (s *Server) engineOptions(pc config.PolicyConfig) []engine.Option {
	n, o := pc.KeyCap()
	return []engine.Option{engine.WithClock(s.clock), engine.WithMaxKeys(n), engine.WithOverflow(o)}
}
