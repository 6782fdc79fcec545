package server

import (
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/slidegate/slidegate/httplimit"
)

// parseKeySpec parses a key specification of the configuration (key,
// routes[].limits[].key, cluster_tag): "ip" (ip, the client's address),
// "header:NAME" (httplimit.HeaderKey), "const:VALUE" (a constant key:
// one key for every request, a global limit), or any of them followed by
// "+route" (httplimit.Compose with rt.Key). Its errors say what is wrong
// with spec; the caller names the field.
func parseKeySpec(spec string, ip httplimit.ClientIP, rt httplimit.Route) (httplimit.KeyFunc, error) {
	base, route := strings.CutSuffix(strings.TrimSpace(spec), "+route")
	var kf httplimit.KeyFunc
	switch {
	case base == "ip":
		kf = ip.Key
	case strings.HasPrefix(base, "header:"):
		name := strings.TrimSpace(strings.TrimPrefix(base, "header:"))
		if !headerName.MatchString(name) {
			return nil, fmt.Errorf("key %q: header name %q is not a valid header name", spec, name)
		}
		kf = httplimit.HeaderKey(name)
	case strings.HasPrefix(base, "const:"):
		v := strings.TrimPrefix(base, "const:")
		if v == "" || len(v) > httplimit.MaxKeyLen || strings.ContainsFunc(v, func(r rune) bool { return r < ' ' || r == 0x7f || r == utf8.RuneError }) {
			return nil, fmt.Errorf("key %q: the constant must be 1 to %d bytes of printable UTF-8", spec, httplimit.MaxKeyLen)
		}
		kf = func(*http.Request) (string, error) { return v, nil }
	default:
		return nil, fmt.Errorf("key %q: want ip, header:NAME or const:VALUE, optionally followed by +route", spec)
	}
	if route {
		kf = httplimit.Compose(kf, rt.Key)
	}
	return kf, nil
}

// keyHeaders returns the canonical names of the request headers cfg
// keys or chooses tiers by: the header: keys of key, the routes' limits
// and cluster tags, and tier_header.
func keyHeaders(cfg Config) []string {
	var out []string
	add := func(spec string) {
		base, _ := strings.CutSuffix(strings.TrimSpace(spec), "+route")
		if name, ok := strings.CutPrefix(base, "header:"); ok {
			out = append(out, http.CanonicalHeaderKey(strings.TrimSpace(name)))
		}
	}
	add(cfg.Key)
	for _, rc := range cfg.Routes {
		add(rc.ClusterTag)
		for _, l := range rc.lists() {
			for _, lc := range l.limits {
				add(lc.Key)
			}
		}
	}
	if cfg.TierHeader != "" {
		out = append(out, http.CanonicalHeaderKey(cfg.TierHeader))
	}
	return out
}
