package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"

	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/httpkit"
	"github.com/slidegate/slidegate/internal/server/config"
)

// gatewayHandler decides every request with the middleware and proxies
// the allowed ones to the upstream.
func (s *Server) gatewayHandler(st *state) (http.Handler, error) {
	cfg := st.cfg
	up, _ := cfg.Upstream.Parse()
	proxies, _ := httpkit.ParsePrefixes(cfg.TrustedProxies)
	forwarded := http.CanonicalHeaderKey(cfg.ClientIPHeader)
	drop := dropHeaders(cfg)
	// Spelt with _ for -, these and the headers the gateway keys or
	// chooses tiers by are dropped too: a CGI-style upstream reads
	// X_API_Key as X-API-Key, a second line the key did not count.
	variants := map[string]bool{"X-Forwarded-For": true, "Forwarded": true}
	for _, h := range append(append([]string(nil), drop...), keyHeaders(cfg)...) {
		variants[h] = true
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			trusted := httpkit.TrustedPeer(proxies, pr.In.RemoteAddr)
			// Headers upstreams take for the client's address or for the
			// URL it asked for are dropped: from a client they are
			// spoofed. The client address header the ip key read (when it
			// is not X-Forwarded-For, which SetXForwarded writes) is
			// passed on from trusted proxies only.
			for _, h := range drop {
				if h != forwarded || !trusted {
					pr.Out.Header.Del(h)
				}
			}
			for k := range pr.Out.Header {
				if strings.IndexByte(k, '_') >= 0 && variants[http.CanonicalHeaderKey(strings.ReplaceAll(k, "_", "-"))] {
					delete(pr.Out.Header, k)
				}
			}
			// Keep the forwarding chain only when a trusted proxy sent it;
			// from anyone else it is a client's claim, and the upstream
			// sees just the address we saw.
			if xff := pr.In.Header["X-Forwarded-For"]; len(xff) > 0 && trusted {
				pr.Out.Header["X-Forwarded-For"] = append([]string(nil), xff...)
			}
			pr.SetXForwarded()
			if f := s.opts.tracing.Propagate; f != nil {
				f(pr.In.Context(), pr.Out.Header)
			}
		},
		Transport: s.tr,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
				return // the client went away
			}
			var ne net.Error
			if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
				s.failInternal(w, r, http.StatusGatewayTimeout, "the upstream did not answer in time", err)
				return
			}
			s.failInternal(w, r, http.StatusBadGateway, "the upstream is unavailable", err)
		},
	}
	h, err := s.limitHandler(st, rp, false) // the override headers are dropped
	if err != nil {
		return nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := checkMethod(r); err != nil {
			s.metrics.bad.WithLabelValues("400").Inc()
			httplimit.WriteError(w, r, http.StatusBadRequest, err)
			return
		}
		h.ServeHTTP(w, r)
	}), nil
}

// limitHandler decides every request as the gateway does (its route's
// limits, else the tier and key of the top level) and hands the allowed
// ones to next: the gateway's proxy, or /v1/check's answer. A state
// serves one of the two, so the routes' handlers wrap next alone.
//
// A request naming other methods to run as (overrideMethods; the
// override headers only when overrideHeaders is set) is decided under
// each (decideOverridden).
func (s *Server) limitHandler(st *state, next http.Handler, overrideHeaders bool) (http.Handler, error) {
	cfg := st.cfg
	opts := s.middlewareOptions(st)
	opts = append(opts, httplimit.WithDefaultTier(st.def.name))
	if cfg.TierHeader != "" {
		opts = append(opts, httplimit.WithTierFunc(httplimit.HeaderTier(cfg.TierHeader)))
	}
	for _, t := range st.policies {
		opts = append(opts, httplimit.WithBackend(t.backend))
	}
	if cfg.ResponseCostHeader != "" {
		opts = append(opts, httplimit.WithResponseCost(cfg.ResponseCostHeader))
	}
	mw, err := httplimit.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	fallback := mw.Handler(next)
	if st.routes != nil {
		for _, x := range st.routes.routes {
			x.h = x.mw.Handler(next)
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ms, err := overrideMethods(r, overrideHeaders); err != nil {
			s.metrics.bad.WithLabelValues("400").Inc()
			httplimit.WriteError(w, r, http.StatusBadRequest, err)
			return
		} else if len(ms) > 0 {
			s.decideOverridden(w, r, st, ms, mw, next)
			return
		}
		if x := st.routes.match(r); x != nil {
			x.h.ServeHTTP(w, r)
			return
		}
		fallback.ServeHTTP(w, r)
	}), nil
}

// middlewareOptions are the options every middleware of st's gateway
// shares: the default key, headers, shadow mode, errors and observation.
func (s *Server) middlewareOptions(st *state) []httplimit.Option {
	cfg := st.cfg
	proxies, _ := httpkit.ParsePrefixes(cfg.TrustedProxies)
	ip := httplimit.ClientIP{TrustedProxies: proxies, Header: cfg.ClientIPHeader, IPv6Prefix: int(cfg.IPv6Prefix)}
	kf, err := config.ParseKeySpec(cfg.Key, ip, httplimit.Route{FoldCase: bool(cfg.RouteFoldCase)})
	if err != nil { // Validate has checked
		kf = func(*http.Request) (string, error) { return "", err }
	}
	opts := []httplimit.Option{
		httplimit.WithKeyFunc(kf),
		httplimit.WithHeaders(cfg.Headers.Which()),
		httplimit.WithShadow(bool(cfg.Shadow)),
		httplimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, status int, err error) {
			if status < 500 {
				s.metrics.bad.WithLabelValues(strconv.Itoa(status)).Inc()
				httplimit.WriteError(w, r, status, err)
				return
			}
			s.backendFailed(w, r, err)
		}),
		httplimit.WithObserver(func(ev httplimit.Event) { s.observeEvent(st, ev) }),
	}
	if cfg.Upstream == "" && cfg.CheckDenyStatus != http.StatusTooManyRequests {
		opts = append(opts, httplimit.WithRefusalHandler(checkRefusal(int(cfg.CheckDenyStatus))))
	}
	if cfg.Upstream != "" {
		opts = append(opts, httplimit.WithRefusalHandler(closeOnRefusal))
	}
	return opts
}

// closeOnRefusal answers a gateway refusal as httplimit.WriteProblem does
// and closes the connection after it, so that a refused client's
// keep-alive connection frees its slot rather than carrying its next
// attempt. (/v1/check's callers are proxies, whose connections carry
// many clients: they stay open.)
func closeOnRefusal(w http.ResponseWriter, r *http.Request, ref httplimit.Refusal) {
	w.Header().Set("Connection", "close")
	httplimit.WriteProblem(w, r, ref)
}

// DefaultDropHeaders are the request headers the gateway removes before
// the upstream (besides drop_headers): client addresses that frameworks
// prefer to the socket's (chi's RealIP reads X-Real-IP and
// True-Client-IP), URL overrides (Symfony and IIS honour
// X-Original-URL and X-Rewrite-URL) and method overrides
// (MethodOverrideHeaders: the upstream runs the method that was
// counted). The client_ip_header is kept when a trusted proxy sent it.
var DefaultDropHeaders = []string{
	"X-Real-IP", "True-Client-IP", "X-Client-IP", "X-Cluster-Client-IP",
	"CF-Connecting-IP", "Fastly-Client-IP", "X-Original-URL", "X-Rewrite-URL",
	"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override",
}

// dropHeaders returns the canonical names of the headers cfg's gateway
// removes: DefaultDropHeaders, drop_headers and the client_ip_header
// (which Rewrite keeps from trusted proxies).
func dropHeaders(cfg config.Config) []string {
	var out []string
	seen := map[string]bool{}
	for _, h := range append(append(append([]string(nil), DefaultDropHeaders...), cfg.DropHeaders...), cfg.ClientIPHeader) {
		c := http.CanonicalHeaderKey(h)
		if c == "X-Forwarded-For" || c == "Forwarded" || seen[c] {
			continue // Rewrite and SetXForwarded own them
		}
		seen[c] = true
		out = append(out, c)
	}
	return out
}
