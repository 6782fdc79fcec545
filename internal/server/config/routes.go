package config

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

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
// refusal by any of them charges none. Tiers choose among Lists: with
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

// LimitList is one list of a route: its limits and where it is in the
// configuration.
type LimitList struct {
	Tier   string // "" for the route's Limits
	Field  string // ".limits" or ".tiers.NAME"
	Limits []LimitConfig
}

// Lists returns the route's lists: Limits first, then the tiers by name.
func (rc RouteConfig) Lists() []LimitList {
	out := []LimitList{{Field: ".limits", Limits: rc.Limits}}
	names := make([]string, 0, len(rc.Tiers))
	for name := range rc.Tiers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		out = append(out, LimitList{Tier: name, Field: ".tiers." + name, Limits: rc.Tiers[name]})
	}
	return out
}

// MethodName is an HTTP method as a route names it: upper case.
var MethodName = regexp.MustCompile(`^[A-Z][A-Z0-9_-]{0,31}$`)

// RoutePrefix returns the prefix rc matches, cleaned.
func RoutePrefix(p string, fold bool) string { return reqpath.Clean(p, fold) }

// validateRoutes checks c.Routes against the policies in seen.
func (c Config) validateRoutes(seen map[string]bool, ip httplimit.ClientIP) error {
	type at struct{ method, prefix string }
	where := map[at]int{}
	for i, rc := range c.Routes {
		f := fmt.Sprintf("routes[%d]", i)
		switch {
		case rc.Path == "" || rc.Path[0] != '/':
			return Errorf(f+".path", "%q must be a path prefix starting with /", rc.Path)
		case len(rc.Path) > MaxRoutePathLen:
			return Errorf(f+".path", "longer than %d bytes", MaxRoutePathLen)
		case strings.ContainsFunc(rc.Path, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '?' || r == '#' || r == ';' }):
			return Errorf(f+".path", "%q holds a space, control character, ?, # or ;: give the decoded path, without a query or path parameters", rc.Path)
		case path.Clean(rc.Path) != strings.TrimSuffix(rc.Path, "/") && path.Clean(rc.Path) != rc.Path:
			return Errorf(f+".path", "%q is not a clean path (want %q): requests are matched by their cleaned path", rc.Path, path.Clean(rc.Path))
		case rc.Method != "" && !MethodName.MatchString(rc.Method):
			return Errorf(f+".method", "%q is not an HTTP method in upper case, such as GET or POST", rc.Method)
		}
		k := at{rc.Method, RoutePrefix(rc.Path, bool(c.RouteFoldCase))}
		if j, dup := where[k]; dup {
			return Errorf(f, "matches the same requests as routes[%d] (%s %s)", j, MethodOrAny(rc.Method), k.prefix)
		}
		where[k] = i
		if len(rc.Limits) == 0 {
			return Errorf(f+".limits", "missing: a route needs at least one limit")
		}
		if rc.ClusterTag != "" {
			if _, err := ParseKeySpec(rc.ClusterTag, ip, httplimit.Route{}); err != nil {
				return Errorf(f+".cluster_tag", "%v", err)
			}
		}
		for _, l := range rc.Lists() {
			lf := f + l.Field
			if l.Tier != "" && !policyName.MatchString(l.Tier) {
				return Errorf(lf, "tier name %q must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit", l.Tier)
			}
			if len(l.Limits) == 0 || len(l.Limits) > MaxLimits {
				return Errorf(lf, "%d limits (want 1 to %d)", len(l.Limits), MaxLimits)
			}
			type pk struct{ policy, key string }
			dup := map[pk]bool{}
			for j, lc := range l.Limits {
				ff := fmt.Sprintf("%s[%d]", lf, j)
				if !seen[lc.Policy] {
					return Errorf(ff+".policy", "%q is not the name of a policy", lc.Policy)
				}
				key := lc.Key
				if key == "" {
					key = c.Key
				}
				if _, err := ParseKeySpec(key, ip, httplimit.Route{}); err != nil {
					return Errorf(ff+".key", "%v", err)
				}
				if dup[pk{lc.Policy, strings.TrimSpace(key)}] {
					return Errorf(ff, "policy %q with key %q is listed twice: a request counts once against one key", lc.Policy, key)
				}
				dup[pk{lc.Policy, strings.TrimSpace(key)}] = true
			}
		}
	}
	return nil
}

// MethodOrAny names a route's method for messages and logs.
func MethodOrAny(method string) string {
	if method == "" {
		return "(any method)"
	}
	return method
}
