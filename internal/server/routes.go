package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/httpkit"
	"github.com/slidegate/slidegate/internal/reqpath"
	"github.com/slidegate/slidegate/internal/server/config"
)

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
		x := &route{method: rc.Method, prefix: config.RoutePrefix(rc.Path, bool(cfg.RouteFoldCase))}
		x.desc = config.MethodOrAny(rc.Method) + " " + x.prefix
		opts := s.middlewareOptions(st)
		for _, l := range rc.Lists() {
			var gls []httplimit.GroupLimit
			for _, lc := range l.Limits {
				spec := lc.Key
				if spec == "" {
					spec = cfg.Key
				}
				kf, err := config.ParseKeySpec(spec, ip, rtk)
				if err != nil {
					return nil, config.Errorf("routes", "%v", err) // Validate has checked
				}
				gls = append(gls, httplimit.GroupLimit{Policy: lc.Policy, Key: kf})
			}
			name := l.Tier
			if name == "" {
				name = defaultList
			}
			opts = append(opts, httplimit.WithLimits(name, g, gls...))
		}
		if rc.ClusterTag != "" {
			tf, err := config.ParseKeySpec(rc.ClusterTag, ip, rtk)
			if err != nil {
				return nil, config.Errorf("routes", "%v", err) // Validate has checked
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
