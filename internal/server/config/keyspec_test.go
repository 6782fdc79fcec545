package config

import (
	"net/http"
	"testing"

	"github.com/slidegate/slidegate/httplimit"
)

func TestParseKeySpec(t *testing.T) {
	r, _ := http.NewRequest("GET", "http://x/a", nil)
	r.RemoteAddr = "192.0.2.1:9"
	r.Header.Set("X-Key", "abc")
	for spec, want := range map[string]string{
		"ip":                 "192.0.2.1",
		"header:X-Key":       "abc",
		" header: x-key ":    "abc",
		"ip+route":           "9:192.0.2.1|GET /a",
		"header:X-Key+route": "3:abc|GET /a",
	} {
		kf, err := ParseKeySpec(spec, httplimit.ClientIP{}, httplimit.Route{})
		if err != nil {
			t.Errorf("%q: %v", spec, err)
			continue
		}
		if got, err := kf(r); err != nil || got != want {
			t.Errorf("%q: key %q, %v; want %q", spec, got, err, want)
		}
	}
	// A header name that is not a token (RFC 9110) matches no request:
	// every request would be refused for want of a key.
	for _, bad := range []string{"", "cookie:x", "header:", "header:a b", "ip+rout", "header:X-API-Key,", "header:X(Key)", "header:Ключ"} {
		if _, err := ParseKeySpec(bad, httplimit.ClientIP{}, httplimit.Route{}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
