package server

import (
	"io"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/slidegate/slidegate/internal/redact"
)

func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /admin/keys", s.adminKeys)
	mux.HandleFunc("DELETE /admin/keys", s.adminKeys)
	mux.HandleFunc("GET /admin/top", s.adminTop())
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
