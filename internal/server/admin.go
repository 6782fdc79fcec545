package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/redact"
	"github.com/slidegate/slidegate/internal/server/config"
)

// Key operations for support staff, on the admin listener only:
//
//	GET    /admin/keys?policy=P&key=K   the key's state under policy P
//	DELETE /admin/keys?policy=P&key=K   drop it (the client starts afresh)
//
// An empty policy names the default policy. Every operation is logged
// (policy, key, outcome) and counted in slidegate_admin_key_operations_total.
// The key is bounded like every client key (httplimit.MaxKeyLen bytes,
// valid UTF-8). Backends that cannot do it (Redis today) answer 501.

// MetricAdminKeyOps counts the admin listener's key operations.
const MetricAdminKeyOps = "slidegate_admin_key_operations_total"

// keyStateJSON is the body of GET /admin/keys.
type keyStateJSON struct {
	Policy        string  `json:"policy"`
	Key           string  `json:"key"`
	Exists        bool    `json:"exists"`
	Limit         int     `json:"limit"`
	Used          int     `json:"used"`
	Remaining     int     `json:"remaining"`
	OldestSeconds float64 `json:"oldest_seconds"`
	ResetSeconds  float64 `json:"reset_seconds"`
}

func newAdminKeyOps(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricAdminKeyOps,
		Help: "Key operations on the admin listener, by operation (inspect, reset) and result (found, absent, error).",
	}, []string{"op", "result"})
	for _, op := range []string{"inspect", "reset"} {
		for _, res := range []string{"found", "absent", "error"} {
			c.WithLabelValues(op, res)
		}
	}
	if err := reg.Register(c); err != nil {
		return nil, fmt.Errorf("server: registering metrics: %w", err)
	}
	return c, nil
}

func (s *Server) adminKeys(w http.ResponseWriter, r *http.Request) {
	op := "inspect"
	if r.Method == http.MethodDelete {
		op = "reset"
	}
	q := r.URL.Query()
	policy, key := q.Get("policy"), q.Get("key")
	fail := func(status int, err error) {
		s.adminOps.WithLabelValues(op, "error").Inc()
		httplimit.WriteError(w, r, status, err)
	}
	switch {
	case !q.Has("key"):
		fail(http.StatusBadRequest, errors.New("the key parameter is required"))
		return
	case len(key) > httplimit.MaxKeyLen:
		fail(http.StatusBadRequest, fmt.Errorf("the key is %d bytes, more than %d", len(key), httplimit.MaxKeyLen))
		return
	case !utf8.ValidString(key) || !utf8.ValidString(policy):
		fail(http.StatusBadRequest, errors.New("the key and policy must be valid UTF-8"))
		return
	}
	t, ok := s.policyNamed(policy)
	if !ok {
		fail(http.StatusNotFound, fmt.Errorf("no policy named %q", policy))
		return
	}
	ka := t.admin
	if ka == nil {
		fail(http.StatusNotImplemented, errors.New("this store cannot inspect or reset keys"))
		return
	}
	p := t.backend.Policy()
	if o, ok := t.limits[key]; ok {
		p.Limit = o // the key's own limit (overrides)
	}
	var (
		st  engine.KeyState
		had bool
		err error
	)
	if op == "reset" {
		had, err = ka.ResetKey(r.Context(), key)
	} else {
		st, had, err = ka.InspectKey(r.Context(), key)
	}
	if err != nil {
		s.log.Warn("admin: "+op+" key failed", "policy", p.Name, "key", redact.Key(key), "err", redact.URLs(err.Error()))
		fail(http.StatusServiceUnavailable, errors.New("the rate-limit store is unavailable"))
		return
	}
	s.adminOps.WithLabelValues(op, found(had)).Inc()
	if op == "reset" {
		s.log.Info("admin: key reset", "policy", p.Name, "key", redact.Key(key), "had_state", had, "remote", r.RemoteAddr)
		writeJSON(w, map[string]any{"policy": p.Name, "key": key, "reset": had})
		return
	}
	s.log.Info("admin: key inspected", "policy", p.Name, "key", redact.Key(key), "has_state", had, "remote", r.RemoteAddr)
	body := keyStateJSON{Policy: p.Name, Key: key, Exists: had, Limit: p.Limit, Remaining: p.Limit}
	if had {
		body.Used, body.Remaining = st.Used, st.Remaining
		body.OldestSeconds, body.ResetSeconds = st.Oldest.Seconds(), st.Reset.Seconds()
	}
	writeJSON(w, body)
}

func found(had bool) string {
	if had {
		return "found"
	}
	return "absent"
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}

// adminGuard is the admin listener's Host allow-list and bearer token,
// built from a configuration (admin_hosts, admin, admin_token_file).
type adminGuard struct {
	any      bool
	names    map[string]bool // lower case, no trailing dot
	prefixes []netip.Prefix
	token    [32]byte // SHA-256 of the token, when hasToken
	hasToken bool
}

// newAdminGuard builds cfg's guard (defaults filled in), reading the
// token file.
func newAdminGuard(cfg config.Config) (*adminGuard, error) {
	g := &adminGuard{names: map[string]bool{}}
	hosts := append([]string(nil), cfg.AdminHosts...)
	if host, _, err := net.SplitHostPort(cfg.Admin); err == nil {
		a, err := netip.ParseAddr(strings.Trim(host, "[]"))
		switch {
		case host == "" || (err == nil && a.IsUnspecified()):
			// Listening everywhere: the machine's own addresses, which
			// scrapers use (a Host that is an address cannot be rebound).
			g.prefixes = append(g.prefixes, interfacePrefixes()...)
		default:
			hosts = append(hosts, host) // the admin's own name is no rebinding
		}
	}
	for _, h := range hosts {
		name, p, err := config.ParseAdminHost(h)
		switch {
		case err != nil:
			return nil, config.Errorf("admin_hosts", "%v", err) // Validate has checked
		case name == "*":
			g.any = true
		case name != "":
			g.names[name] = true
		default:
			g.prefixes = append(g.prefixes, p)
		}
	}
	if cfg.AdminTokenFile != "" {
		b, err := os.ReadFile(cfg.AdminTokenFile)
		if err != nil {
			return nil, config.Errorf("admin_token_file", "%v", err)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return nil, config.Errorf("admin_token_file", "%s is empty", cfg.AdminTokenFile)
		}
		g.token, g.hasToken = sha256.Sum256([]byte(tok)), true
	}
	return g, nil
}

// interfacePrefixes returns the machine's interface addresses, each as a
// single-address prefix.
func interfacePrefixes() []netip.Prefix {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				ip = ip.Unmap()
				out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
	}
	return out
}

// allowHost reports whether the Host header host (with or without a
// port) is on the list. An absent Host (HTTP/1.0) is allowed: DNS
// rebinding needs a browser, and browsers always send one.
func (g *adminGuard) allowHost(host string) bool {
	if g.any || host == "" {
		return true
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if a, err := netip.ParseAddr(host); err == nil {
		a = a.Unmap().WithZone("")
		for _, p := range g.prefixes {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return g.names[strings.ToLower(strings.TrimSuffix(host, "."))]
}

// allowToken reports whether r carries the bearer token (always, when
// none is configured). The comparison is of SHA-256 digests in constant
// time, so that neither the token's bytes nor its length leak by timing.
func (g *adminGuard) allowToken(r *http.Request) bool {
	if !g.hasToken {
		return true
	}
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	return subtle.ConstantTimeCompare(sum[:], g.token[:]) == 1
}

// guardAdmin answers the admin listener's requests whose Host is not on
// the allow-list (403) or that lack the bearer token (401); /healthz and
// /readyz, which reveal and change nothing, answer every request, for
// probes that send the pod's address and no token.
func (s *Server) guardAdmin(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			h.ServeHTTP(w, r)
			return
		}
		g := s.cur.Load().admin
		if !g.allowHost(r.Host) {
			s.metrics.bad.WithLabelValues("403").Inc()
			httplimit.WriteError(w, r, http.StatusForbidden, errors.New("this Host is not one the admin listener answers (admin_hosts)"))
			return
		}
		if !g.allowToken(r) {
			s.metrics.bad.WithLabelValues("401").Inc()
			w.Header().Set("WWW-Authenticate", `Bearer realm="slidegate admin"`)
			httplimit.WriteError(w, r, http.StatusUnauthorized, errors.New("the admin listener needs Authorization: Bearer TOKEN (admin_token_file)"))
			return
		}
		h.ServeHTTP(w, r)
	})
}
