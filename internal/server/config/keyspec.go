package config

import (
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/slidegate/slidegate/httplimit"
)

// ParseKeySpec parses a key specification of the configuration (key,
// routes[].limits[].key, cluster_tag): "ip" (ip, the client's address),
// "header:NAME" (httplimit.HeaderKey), "const:VALUE" (a constant key:
// one key for every request, a global limit), or any of them followed by
// "+route" (httplimit.Compose with rt.Key). Its errors say what is wrong
// with spec; the caller names the field.
func ParseKeySpec(spec string, ip httplimit.ClientIP, rt httplimit.Route) (httplimit.KeyFunc, error) {
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

// CheckKey reports what is wrong with key, a rate-limit key of the
// configuration (an override's) or of a request (field names it): empty,
// longer than httplimit.MaxKeyLen, or invalid UTF-8.
func CheckKey(field, key string) error {
	if key == "" {
		return fmt.Errorf(`missing %s (a non-empty string)`, field)
	}
	if len(key) > httplimit.MaxKeyLen {
		return fmt.Errorf(`%s is longer than %d bytes`, field, httplimit.MaxKeyLen)
	}
	if strings.ContainsRune(key, utf8.RuneError) {
		return fmt.Errorf(`%s holds invalid UTF-8 (an unpaired surrogate escape or U+FFFD, the replacement character): different keys would be counted as one`, field)
	}
	return nil
}
