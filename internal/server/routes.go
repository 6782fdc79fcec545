package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/httpkit"
	"github.com/slidegate/slidegate/internal/reqpath"
)

// MaxLimits bounds the limits of one request: of a route's list in the
// configuration, and of one decision API request ("limits").
const MaxLimits = httpkit.MaxLimits

// MaxRoutePathLen bounds a route's path prefix in the configuration.
const MaxRoutePathLen = 1024

// RouteConfig maps requests to the limits they count against (gateway
// mode). A request matches a route when its method is Method (any method
// when empty; a GET route also matches HEAD, which servers answer with
// GET's handler) and its path, without path parameters (";jsessionid=1",
// which Tomcat, Jetty and Spring strip) and cleaned as path.Clean does
// ("//a/./b" is "/a/b"; lower-cased with route_fold_case), is Path or lies
// below it, segment-wise: path "/api" matches "/api" and "/api/v1", not
// "/apis". The longest matching Path wins; at equal length a route naming
// the method beats one for any method, and a HEAD route beats a GET route
// for HEAD requests. The gateway answers a method with a lower-case letter
// ("post") 400, as nginx does: Django and Flask would serve it as POST.
//
// Every request of the route is decided against all of its limits at
// once, all or nothing: it is allowed only if each limit has room, and a
// refusal by any of them charges none. Tiers choose among lists: with
// tier_header set, a request naming a tier of the route gets that list,
// one naming no tier gets Limits, and one naming a tier the route does not
// have is answered 400. A route without tiers ignores the tier header.
//
// ClusterTag matters only on a store that keeps keys in partitions (Redis
// Cluster): it is a key spec (as LimitConfig.Key) whose value places every
// key of a request in one hash slot, so that one atomic call decides them.
// It is required there when a list's limits use different keys; a limit
// whose key is not the tag then counts per tag value too (per API key and
// IP, rather than per IP). Other stores ignore it.
type RouteConfig struct {
	Method     string                   `yaml:"method,omitempty"`
	Path       string                   `yaml:"path"`
	Limits     []LimitConfig            `yaml:"limits"`
	Tiers      map[string][]LimitConfig `yaml:"tiers,omitempty"`
	ClusterTag string                   `yaml:"cluster_tag,omitempty"`
}

// LimitConfig is one limit of a route: a policy, and the key the request
// counts against it with: "ip", "header:NAME", "const:VALUE" (one key for
// every request: a global limit), any of them followed by "+route"; empty
// means the top-level key.
type LimitConfig struct {
	Policy string `yaml:"policy"`
	Key    string `yaml:"key,omitempty"`
}

// limitList is one list of a route: its limits and where it is in the
// configuration.
type limitList struct {
	tier   string // "" for the route's Limits
	field  string // ".limits" or ".tiers.NAME"
	limits []LimitConfig
}

// lists returns the route's lists: Limits first, then the tiers by name.
func (rc RouteConfig) lists() []limitList {
	out := []limitList{{field: ".limits", limits: rc.Limits}}
	names := make([]string, 0, len(rc.Tiers))
	for name := range rc.Tiers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		out = append(out, limitList{tier: name, field: ".tiers." + name, limits: rc.Tiers[name]})
	}
	return out
}

var methodName = regexp.MustCompile(`^[A-Z][A-Z0-9_-]{0,31}$`)

// routePrefix returns the prefix rc matches, cleaned.
func routePrefix(p string, fold bool) string { return reqpath.Clean(p, fold) }

// validateRoutes checks c.Routes against the policies in seen.
func (c Config) validateRoutes(seen map[string]bool, ip httplimit.ClientIP) error {
	type at struct{ method, prefix string }
	where := map[at]int{}
	for i, rc := range c.Routes {
		f := fmt.Sprintf("routes[%d]", i)
		switch {
		case rc.Path == "" || rc.Path[0] != '/':
			return fieldErr(f+".path", "%q must be a path prefix starting with /", rc.Path)
		case len(rc.Path) > MaxRoutePathLen:
			return fieldErr(f+".path", "longer than %d bytes", MaxRoutePathLen)
		case strings.ContainsFunc(rc.Path, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '?' || r == '#' || r == ';' }):
			return fieldErr(f+".path", "%q holds a space, control character, ?, # or ;: give the decoded path, without a query or path parameters", rc.Path)
		case path.Clean(rc.Path) != strings.TrimSuffix(rc.Path, "/") && path.Clean(rc.Path) != rc.Path:
			return fieldErr(f+".path", "%q is not a clean path (want %q): requests are matched by their cleaned path", rc.Path, path.Clean(rc.Path))
		case rc.Method != "" && !methodName.MatchString(rc.Method):
			return fieldErr(f+".method", "%q is not an HTTP method in upper case, such as GET or POST", rc.Method)
		}
		k := at{rc.Method, routePrefix(rc.Path, bool(c.RouteFoldCase))}
		if j, dup := where[k]; dup {
			return fieldErr(f, "matches the same requests as routes[%d] (%s %s)", j, orAny(rc.Method), k.prefix)
		}
		where[k] = i
		if len(rc.Limits) == 0 {
			return fieldErr(f+".limits", "missing: a route needs at least one limit")
		}
		if rc.ClusterTag != "" {
			if _, err := parseKeySpec(rc.ClusterTag, ip, httplimit.Route{}); err != nil {
				return fieldErr(f+".cluster_tag", "%v", err)
			}
		}
		for _, l := range rc.lists() {
			lf := f + l.field
			if l.tier != "" && !policyName.MatchString(l.tier) {
				return fieldErr(lf, "tier name %q must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit", l.tier)
			}
			if len(l.limits) == 0 || len(l.limits) > MaxLimits {
				return fieldErr(lf, "%d limits (want 1 to %d)", len(l.limits), MaxLimits)
			}
			type pk struct{ policy, key string }
			dup := map[pk]bool{}
			for j, lc := range l.limits {
				ff := fmt.Sprintf("%s[%d]", lf, j)
				if !seen[lc.Policy] {
					return fieldErr(ff+".policy", "%q is not the name of a policy", lc.Policy)
				}
				key := lc.Key
				if key == "" {
					key = c.Key
				}
				if _, err := parseKeySpec(key, ip, httplimit.Route{}); err != nil {
					return fieldErr(ff+".key", "%v", err)
				}
				if dup[pk{lc.Policy, strings.TrimSpace(key)}] {
					return fieldErr(ff, "policy %q with key %q is listed twice: a request counts once against one key", lc.Policy, key)
				}
				dup[pk{lc.Policy, strings.TrimSpace(key)}] = true
			}
		}
	}
	return nil
}

func orAny(method string) string {
	if method == "" {
		return "(any method)"
	}
	return method
}

// route is one configured route, ready to serve.
type route struct {
	method string
	prefix string
	desc   string // "POST /login", for logs
	mw     *httplimit.Middleware
	h      http.Handler // mw around the gateway's proxy, or /v1/check's answer
}

// router finds a request's route: the longest prefix, then a named
// method before any method.
type router struct {
	routes   []*route // longest prefix first; method-specific first
	foldCase bool
}

// match returns the route of r, or nil.
func (rt *router) match(r *http.Request) *route {
	if rt == nil || len(rt.routes) == 0 {
		return nil
	}
	p := reqpath.Clean(r.URL.Path, rt.foldCase)
	m := r.Method
	if !reqpath.Canonical(m) {
		// The gateway refuses these before; /v1/check, which cannot,
		// counts "post" as the POST its upstream may serve it as.
		m = strings.ToUpper(m)
	}
	for _, x := range rt.routes {
		if x.method != "" && x.method != m && x.method != reqpath.Method(m) {
			continue
		}
		if x.prefix == "/" || p == x.prefix || (strings.HasPrefix(p, x.prefix) && p[len(x.prefix)] == '/') {
			return x
		}
	}
	return nil
}

// errMethodCase answers a method spelt with a lower-case letter.
var errMethodCase = errors.New("the method has a lower-case letter: methods are case-sensitive, and standard ones are upper case")

// checkMethod returns errMethodCase for a method that RFC 9110 servers
// would not take for a standard one but some upstreams would ("post").
func checkMethod(r *http.Request) error {
	if !reqpath.Canonical(r.Method) {
		return errMethodCase
	}
	return nil
}

// defaultList names a route's Limits among its tiers in its middleware:
// no tier name in the configuration can be it (policyName forbids
// parentheses), so no header can choose it by name.
const defaultList = "(route)"

// newRouter builds st's routes, each a middleware whose tiers are the
// route's lists, decided by the state's group (or, when the store has
// none, by one backend: needGroup has checked that every list then has a
// single limit).
func (s *Server) newRouter(st *state) (*router, error) {
	cfg := st.cfg
	if len(cfg.Routes) == 0 { // without an upstream, routes serve /v1/check
		return nil, nil
	}
	proxies, _ := httpkit.ParsePrefixes(cfg.TrustedProxies)
	ip := httplimit.ClientIP{TrustedProxies: proxies, Header: cfg.ClientIPHeader, IPv6Prefix: int(cfg.IPv6Prefix)}
	rtk := httplimit.Route{FoldCase: bool(cfg.RouteFoldCase)}
	g := st.group
	if g == nil {
		g = backendsGroup{st: st}
	}
	rt := &router{foldCase: bool(cfg.RouteFoldCase)}
	for _, rc := range cfg.Routes {
		x := &route{method: rc.Method, prefix: routePrefix(rc.Path, bool(cfg.RouteFoldCase))}
		x.desc = orAny(rc.Method) + " " + x.prefix
		opts := s.middlewareOptions(st)
		for _, l := range rc.lists() {
			var gls []httplimit.GroupLimit
			for _, lc := range l.limits {
				spec := lc.Key
				if spec == "" {
					spec = cfg.Key
				}
				kf, err := parseKeySpec(spec, ip, rtk)
				if err != nil {
					return nil, fieldErr("routes", "%v", err) // Validate has checked
				}
				gls = append(gls, httplimit.GroupLimit{Policy: lc.Policy, Key: kf})
			}
			name := l.tier
			if name == "" {
				name = defaultList
			}
			opts = append(opts, httplimit.WithLimits(name, g, gls...))
		}
		if rc.ClusterTag != "" {
			tf, err := parseKeySpec(rc.ClusterTag, ip, rtk)
			if err != nil {
				return nil, fieldErr("routes", "%v", err) // Validate has checked
			}
			opts = append(opts, httplimit.WithTag(tf))
		}
		opts = append(opts, httplimit.WithDefaultTier(defaultList))
		if cfg.TierHeader != "" && len(rc.Tiers) > 0 {
			opts = append(opts, httplimit.WithTierFunc(httplimit.HeaderTier(cfg.TierHeader)))
		}
		mw, err := httplimit.New(opts...)
		if err != nil {
			return nil, fmt.Errorf("server: route %s: %w", x.desc, err)
		}
		x.mw = mw
		rt.routes = append(rt.routes, x)
	}
	slices.SortStableFunc(rt.routes, func(a, b *route) int {
		if len(a.prefix) != len(b.prefix) {
			return len(b.prefix) - len(a.prefix)
		}
		switch {
		case a.method != "" && b.method == "":
			return -1
		case a.method == "" && b.method != "":
			return 1
		case a.method == "HEAD" && b.method != "HEAD":
			return -1 // before GET, which matches HEAD too
		case a.method != "HEAD" && b.method == "HEAD":
			return 1
		}
		return 0
	})
	return rt, nil
}

// backendsGroup decides single-limit requests over st's backends, for a
// store without a group: a route of one limit then needs none.
type backendsGroup struct{ st *state }

func (b backendsGroup) Policies() []engine.Policy {
	ps := make([]engine.Policy, len(b.st.policies))
	for i, t := range b.st.policies {
		ps[i] = t.ep
	}
	return ps
}

func (b backendsGroup) NeedsTag() bool { return false }

func (b backendsGroup) DecideGroup(ctx context.Context, dst []engine.Decision, req engine.GroupRequest) (engine.GroupDecision, error) {
	refs, n := req.Refs, req.N
	if len(refs) != 1 || refs[0].Policy < 0 || refs[0].Policy >= len(b.st.policies) || (req.Costs != nil && len(req.Costs) != 1) {
		return engine.GroupDecision{}, fmt.Errorf("%w: this store decides one limit per request", engine.ErrInvalidKeys)
	}
	if req.Costs != nil {
		n = req.Costs[0]
	}
	d, err := b.st.policies[refs[0].Policy].backend.Decide(ctx, refs[0].Key, n)
	if err != nil {
		return engine.GroupDecision{}, err
	}
	return engine.GroupDecision{Allowed: d.Allowed, Limits: append(dst[:0], d)}, nil
}

func (b backendsGroup) WallTime(at int64) time.Time { return b.st.def.backend.WallTime(at) }
func (b backendsGroup) Close() error                { return nil }
