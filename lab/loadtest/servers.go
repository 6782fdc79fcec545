package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/httpkit"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

// The harness's targets. It starts slidegate's real server (package
// server, as `slidegate serve` runs it) on 127.0.0.1:0, and records its
// decisions from its own side: the server's backends are made by a store
// factory of the harness (storeScheme) that wraps each one in a
// recordingBackend. The no-op baseline is the harness's own handler
// (noopHandler) served the same way (net/http, the server's timeouts, the
// body read under the same bound), on its own listener: the harness uses
// no test route or hook of the server.

// storeScheme is the store URL scheme the harness registers with
// server.WithStore for in-memory backends it can record.
const storeScheme = "loadtest"

// recordingBackend hands every decision its backend makes to a recorder,
// under the backend's policy name. It is safe for concurrent use if the
// backend is.
type recordingBackend struct {
	engine.Backend
	rec  *recorder
	name string
	// policy is name's index in rec (known: rec knows name), looked up
	// once rather than at each decision.
	policy uint8
	known  bool
}

var _ httpkit.KeyBorrower = (*recordingBackend)(nil)

// BorrowsKey implements httpkit.KeyBorrower: the recorder keeps no key
// string it is handed (it keeps client indices, and copies the keys it
// interns), so the wrapper keeps a key only if its backend does. The
// server then hands the in-memory engine under it the same view of the
// request body as when it runs without the harness.
func (b *recordingBackend) BorrowsKey() bool { return httpkit.BorrowsKey(b.Backend) }

// Decide implements engine.Backend: the inner decision, recorded when it
// is one (errors decide nothing).
func (b *recordingBackend) Decide(ctx context.Context, key string, n int) (engine.Decision, error) {
	d, err := b.Backend.Decide(ctx, key, n)
	switch {
	case err != nil:
	case b.known:
		b.rec.AddIndex(b.policy, key, n, d)
	default:
		b.rec.Add(b.name, key, n, d) // counted as under an unknown policy
	}
	return d, err
}

// wrapRecording wraps each backend in a recordingBackend when rec is not
// nil.
func wrapRecording(bs []engine.Backend, rec *recorder) []engine.Backend {
	if rec == nil {
		return bs
	}
	out := make([]engine.Backend, len(bs))
	for i, b := range bs {
		name := b.Policy().Name
		p, known := rec.policyIndex(name)
		out[i] = &recordingBackend{Backend: b, rec: rec, name: name, policy: p, known: known}
	}
	return out
}

// storeOf is the server.Store of bs: no group (the harness's
// configurations decide one limit per request), closed by closing each
// backend.
func storeOf(bs []engine.Backend) server.Store {
	return server.Store{Backends: bs, Close: func() error {
		var errs []error
		for _, b := range bs {
			errs = append(errs, b.Close())
		}
		return errors.Join(errs...)
	}}
}

// memoryStore is the server.StoreFactory of the in-memory engine, as the
// server's built-in "memory" store makes it (engine.New per policy), its
// backends recorded by rec when not nil.
func memoryStore(rec *recorder) server.StoreFactory {
	return func(_ context.Context, spec server.StoreSpec) (server.Store, error) {
		var out []engine.Backend
		for _, p := range spec.Policies {
			l, err := engine.New(p)
			if err != nil {
				for _, b := range out {
					_ = b.Close()
				}
				return server.Store{}, err
			}
			out = append(out, l)
		}
		return storeOf(wrapRecording(out, rec)), nil
	}
}

// target is a server under test on loopback.
type target struct {
	base  string // http://127.0.0.1:port
	close func()
}

// serverConfig is the in-process server's configuration: the run's tiers
// as policies, the main listener on 127.0.0.1:0, no admin listener, the
// given store URL.
func serverConfig(policies []engine.Policy, store string) config.Config {
	scfg := config.DefaultConfig()
	scfg.Listen, scfg.Admin = "127.0.0.1:0", "off"
	scfg.Store = store
	scfg.Policies = nil
	for _, p := range policies {
		scfg.Policies = append(scfg.Policies, config.PolicyConfig{Name: p.Name, Limit: config.Int(p.Limit), Window: config.Duration(p.Window), Algorithm: p.Algorithm.String()})
	}
	scfg.DefaultPolicy = config.PolicyName(policies[0].Name)
	return scfg
}

// startSlidegate starts slidegate's server for policies on 127.0.0.1:0
// with the store URL store (storeScheme+"://memory" for the in-memory
// engine) and the given store factories; each of mods, in order, may
// change its configuration.
func startSlidegate(policies []engine.Policy, store string, stores map[string]server.StoreFactory, mods ...func(*config.Config)) (*target, error) {
	opts := []server.Option{server.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}
	for scheme, f := range stores {
		opts = append(opts, server.WithStore(scheme, f))
	}
	scfg := serverConfig(policies, store)
	for _, m := range mods {
		m(&scfg)
	}
	srv, err := server.New(scfg, opts...)
	if err != nil {
		return nil, fmt.Errorf("loadtest: in-process server: %w", err)
	}
	if err := srv.Start(); err != nil {
		_ = srv.Close()
		return nil, fmt.Errorf("loadtest: in-process server: %w", err)
	}
	return &target{base: "http://" + srv.Addr(), close: func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}}, nil
}

// startMemorySlidegate starts the server on the in-memory engine,
// recording into rec when it is not nil; mods are startSlidegate's.
func startMemorySlidegate(policies []engine.Policy, rec *recorder, mods ...func(*config.Config)) (*target, error) {
	return startSlidegate(policies, storeScheme+"://memory", map[string]server.StoreFactory{storeScheme: memoryStore(rec)}, mods...)
}

// The decision API's header families that --capacity-headers turns on:
// decision_headers' keys, both off by default.
const (
	headersDraft = "draft" // RateLimit-Policy and RateLimit
	headersX     = "x"     // X-RateLimit-Limit, -Remaining and -Reset
)

// withDecisionHeaders turns on the decision API's header families named
// (headersDraft, headersX); the others keep their defaults.
func withDecisionHeaders(families ...string) func(*config.Config) {
	return func(c *config.Config) {
		on := config.Bool(true)
		for _, f := range families {
			switch f {
			case headersDraft:
				c.DecisionHeaders.Draft = &on
			case headersX:
				c.DecisionHeaders.X = &on
			}
		}
	}
}

// noopHandler answers POST /v1/allow with 204 No Content after reading the
// body under the server's body bound, deciding nothing: the HTTP stack's
// own cost. Other paths get 404, as on the server.
func noopHandler(maxBody int64) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/allow", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		_, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/", http.NotFound)
	return mux
}

// startNoop serves noopHandler on 127.0.0.1:0 the way server.Start serves
// the decision API: net/http with the default configuration's read,
// header, write and idle timeouts and its header size bound. It takes the same path and bodies as the
// decision API, so the same targeter drives both.
func startNoop() (*target, error) {
	// The server's own http.Server settings (DefaultConfig fills every
	// one): only the handler differs, and what the server adds around it
	// (its connection limit, connection metrics) counts as its cost.
	dc := config.DefaultConfig()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("loadtest: no-op server: %w", err)
	}
	hs := &http.Server{
		Handler:           noopHandler(int64(dc.MaxBodyBytes)),
		ReadHeaderTimeout: time.Duration(dc.ReadTimeout),
		ReadTimeout:       time.Duration(dc.ReadTimeout),
		WriteTimeout:      time.Duration(dc.WriteTimeout),
		IdleTimeout:       time.Duration(dc.IdleTimeout),
		MaxHeaderBytes:    int(dc.MaxHeaderBytes),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(lis) }()
	return &target{base: "http://" + lis.Addr().String(), close: func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil {
			_ = hs.Close()
		}
		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // the listener is gone either way
		}
	}}, nil
}
