package server

import (
	"errors"
	"io"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/httpkit"
	"github.com/slidegate/slidegate/internal/redact"
)

func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	mux.HandleFunc("/debug/pprof/", s.tokenOrLoopback(pprof.Index))
	mux.HandleFunc("/debug/pprof/cmdline", s.tokenOrLoopback(cmdline))
	mux.HandleFunc("/debug/pprof/profile", s.tokenOrLoopback(pprof.Profile))
	mux.HandleFunc("/debug/pprof/symbol", s.tokenOrLoopback(pprof.Symbol))
	mux.HandleFunc("/debug/pprof/trace", s.tokenOrLoopback(pprof.Trace))
	mux.HandleFunc("GET /admin/keys", s.tokenOrLoopback(s.adminKeys))
	mux.HandleFunc("DELETE /admin/keys", s.tokenOrLoopback(s.adminKeys))
	mux.HandleFunc("GET /admin/top", s.tokenOrLoopback(s.adminTop()))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !s.ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "not ready\n")
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	return s.guardAdmin(mux)
}

// errAdminNeedsToken answers a key operation or a profile asked by a
// peer beyond loopback when no admin_token_file is set.
var errAdminNeedsToken = errors.New("key operations and /debug/pprof/ answer a peer beyond loopback only with admin_token_file set: set it, or call from the machine itself")

// tokenOrLoopback guards h, which changes a client's state (key
// operations) or reveals the process's internals (pprof): without
// admin_token_file it answers only loopback peers, and others get 403.
// An admin listener bound beyond loopback (the pod network, 0.0.0.0)
// thus lends neither to its neighbours. With a token, guardAdmin has
// checked it already.
func (s *Server) tokenOrLoopback(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.cur.Load().admin.hasToken {
			if a, err := httpkit.ParseHostPort(r.RemoteAddr); err != nil || !a.Unmap().IsLoopback() {
				s.metrics.bad.WithLabelValues("403").Inc()
				httplimit.WriteError(w, r, http.StatusForbidden, errAdminNeedsToken)
				return
			}
		}
		h(w, r)
	}
}

// cmdline is pprof.Cmdline with passwords in URLs redacted: the command
// line may carry --store redis://:PASSWORD@host.
func cmdline(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	args := make([]string, len(os.Args))
	for i, a := range os.Args {
		args[i] = redact.URLs(a)
	}
	_, _ = io.WriteString(w, strings.Join(args, "\x00"))
}
