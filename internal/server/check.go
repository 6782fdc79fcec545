package server

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/headerfmt"
	"github.com/slidegate/slidegate/internal/httpkit"
)

// CheckPath is the check endpoint for proxies on the main listener of the
// decision API (no upstream): nginx's auth_request, Caddy's forward_auth,
// Traefik's ForwardAuth and Envoy's HTTP ext_authz ask it about each
// request they receive, and it decides the original request as gateway
// mode would (docs/integrations.md).
const CheckPath = "/v1/check"

// The headers that carry the original request: Caddy and Traefik send the
// X-Forwarded pair, nginx's configuration sets the X-Original pair. When
// both are present the X-Forwarded one wins, so nginx's configuration
// clears it (a client could otherwise send it through nginx).
const (
	hForwardedMethod = "X-Forwarded-Method"
	hForwardedURI    = "X-Forwarded-Uri"
	hOriginalMethod  = "X-Original-Method"
	hOriginalURI     = "X-Original-Uri" // X-Original-URI, canonical
)

// errCheckUntrusted answers a check request from a peer outside
// trusted_proxies: its forwarding headers would let it spend any client's
// quota.
var errCheckUntrusted = errors.New("/v1/check answers only the proxies listed in trusted_proxies")

// checkHandler serves CheckPath: any method; the original request is
// decided through the gateway's own routes, tiers and keys (limitHandler),
// and answered 200 with the rate-limit headers and no body when allowed,
// check_deny_status with them (Retry-After included) when refused.
func (s *Server) checkHandler(st *state) (http.Handler, error) {
	proxies, _ := httpkit.ParsePrefixes(st.cfg.TrustedProxies) // Validate has checked
	decide, err := s.limitHandler(st, http.HandlerFunc(checkAllowed), true)
	if err != nil {
		return nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !httpkit.TrustedPeer(proxies, r.RemoteAddr) {
			s.fail(w, r, http.StatusForbidden, errCheckUntrusted)
			return
		}
		orig, err := originalRequest(r)
		if err != nil {
			s.fail(w, r, http.StatusBadRequest, err)
			return
		}
		decide.ServeHTTP(w, orig)
	}), nil
}

// checkAllowed answers an allowed check: 200, the headers the middleware
// set, no body.
func checkAllowed(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }

// checkRefusal answers a refused check with status (401 or 403, for
// nginx) and a problem+json body, after the middleware's headers.
func checkRefusal(status int) func(http.ResponseWriter, *http.Request, httplimit.Refusal) {
	return func(w http.ResponseWriter, r *http.Request, ref httplimit.Refusal) {
		secs := headerfmt.CeilSeconds(ref.Decision.RetryAfter)
		httplimit.WriteError(w, r, status, fmt.Errorf("rate limited by policy %q; retry in %s s", ref.Policy.Name, strconv.FormatInt(secs, 10)))
	}
}

// originalRequest returns the request a check request asks about: r with
// the original method and URI, no body. The URI comes from X-Forwarded-Uri
// or X-Original-URI, the method from X-Forwarded-Method or
// X-Original-Method; under CheckPath + "/" without a URI header (Envoy's
// path_prefix) the rest of the path is the original URI and the method
// r's own. Without them it is an error: a check is never decided as
// itself. A fragment ("#x") is cut from the URI before it is matched.
func originalRequest(r *http.Request) (*http.Request, error) {
	uri := firstOf(r.Header, hForwardedURI, hOriginalURI)
	method := firstOf(r.Header, hForwardedMethod, hOriginalMethod)
	if uri == "" {
		if rest, ok := strings.CutPrefix(r.URL.EscapedPath(), CheckPath+"/"); ok {
			uri = "/" + rest
			if r.URL.RawQuery != "" {
				uri += "?" + r.URL.RawQuery
			}
			if method == "" {
				method = r.Method
			}
		}
	}
	switch {
	case uri == "":
		return nil, errors.New("missing the original request's URI: send X-Forwarded-Uri (Caddy, Traefik) or X-Original-URI (nginx)")
	case method == "":
		return nil, errors.New("missing the original request's method: send X-Forwarded-Method (Caddy, Traefik) or X-Original-Method (nginx)")
	}
	// A fragment is not part of the path: the applications behind the
	// proxy (Flask, Express, Rails) route "/login#x" as "/login". The
	// proxy passes the original request line through, "#" and all.
	uri, _, _ = strings.Cut(uri, "#")
	u, err := url.ParseRequestURI(uri)
	if err != nil || u.Path == "" {
		// A URI the proxy accepted from its client but that does not
		// parse is still decided, by its raw path: the client chose it.
		p, _, _ := strings.Cut(uri, "?")
		u = &url.URL{Path: p}
	}
	o := r.WithContext(r.Context())
	o.Method, o.URL, o.RequestURI = method, u, uri
	o.Body, o.ContentLength = http.NoBody, 0
	return o, nil
}

// firstOf returns the first non-empty value of the first of names that h
// carries.
func firstOf(h http.Header, names ...string) string {
	for _, n := range names {
		if v := strings.TrimSpace(h.Get(n)); v != "" {
			return v
		}
	}
	return ""
}
