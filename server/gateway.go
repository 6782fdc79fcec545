package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"

	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/httpkit"
)

// gatewayHandler decides every request with the middleware and proxies
// the allowed ones to the upstream.
func (s *Server) gatewayHandler(st *state) (http.Handler, error) {
	cfg := st.cfg
	up, _ := url.Parse(cfg.Upstream)
	proxies, _ := httpkit.ParsePrefixes(cfg.TrustedProxies)
	forwarded := http.CanonicalHeaderKey(cfg.ClientIPHeader)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			// Keep the forwarding chain only when a trusted proxy sent it;
			// from anyone else it is a client's claim, and the upstream
			// sees just the address we saw.
			if xff := pr.In.Header["X-Forwarded-For"]; len(xff) > 0 {
				if httpkit.TrustedPeer(proxies, pr.In.RemoteAddr) {
					pr.Out.Header["X-Forwarded-For"] = append([]string(nil), xff...)
				}
			}
			// The client address header the ip key read (when it is not
			// X-Forwarded-For, which SetXForwarded writes) is passed on
			// from trusted proxies only.
			if forwarded != "X-Forwarded-For" && forwarded != "Forwarded" {
				if !httpkit.TrustedPeer(proxies, pr.In.RemoteAddr) {
					pr.Out.Header.Del(forwarded)
				}
			}
			pr.SetXForwarded()
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
	return s.limitHandler(st, rp)
}

// limitHandler decides every request as the gateway does (its route's
// limits, else the tier and key of the top level) and hands the allowed
// ones to next: the gateway's proxy, or /v1/check's answer. A state
// serves one of the two, so the routes' handlers wrap next alone.
func (s *Server) limitHandler(st *state, next http.Handler) (http.Handler, error) {
	cfg := st.cfg
	opts := s.middlewareOptions(st)
	opts = append(opts, httplimit.WithDefaultTier(st.def.name))
	if cfg.TierHeader != "" {
		opts = append(opts, httplimit.WithTierFunc(httplimit.HeaderTier(cfg.TierHeader)))
	}
	for _, t := range st.tiers {
		opts = append(opts, httplimit.WithBackend(t.backend))
	}
	mw, err := httplimit.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	fallback := mw.Handler(next)
	if st.routes == nil {
		return fallback, nil
	}
	for _, x := range st.routes.routes {
		x.h = x.mw.Handler(next)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	ip := httplimit.ClientIP{TrustedProxies: proxies, Header: cfg.ClientIPHeader, IPv6Prefix: cfg.IPv6Prefix}
	kf, err := parseKeySpec(cfg.Key, ip, httplimit.Route{FoldCase: cfg.RouteFoldCase})
	if err != nil { // Validate has checked
		kf = func(*http.Request) (string, error) { return "", err }
	}
	opts := []httplimit.Option{
		httplimit.WithKeyFunc(kf),
		httplimit.WithHeaders(cfg.Headers.Which()),
		httplimit.WithShadow(cfg.Shadow),
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
		opts = append(opts, httplimit.WithRefusalHandler(checkRefusal(cfg.CheckDenyStatus)))
	}
	return opts
}
