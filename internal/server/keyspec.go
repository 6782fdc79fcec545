package server

import (
	"net/http"
	"strings"

	"github.com/slidegate/slidegate/internal/server/config"
)

// keyHeaders returns the canonical names of the request headers cfg
// keys or chooses tiers by: the header: keys of key, the routes' limits
// and cluster tags, and tier_header.
func keyHeaders(cfg config.Config) []string {
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
		for _, l := range rc.Lists() {
			for _, lc := range l.Limits {
				add(lc.Key)
			}
		}
	}
	if cfg.TierHeader != "" {
		out = append(out, http.CanonicalHeaderKey(cfg.TierHeader))
	}
	return out
}
