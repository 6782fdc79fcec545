package httplimit_test

import (
	"bufio"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/httplimit"
)

func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8"), netip.MustParsePrefix("192.0.2.7/32")}
	proxied := httplimit.ClientIP{TrustedProxies: trusted}
	fwd := httplimit.ClientIP{TrustedProxies: trusted, Header: "forwarded"}
	realIP := httplimit.ClientIP{TrustedProxies: trusted, Header: "X-Real-IP"}
	none := httplimit.ClientIP{}
	cases := []struct {
		name    string
		c       httplimit.ClientIP
		remote  string
		headers map[string][]string
		want    string // "" means an error wrapping ErrNoKey
	}{
		{"ipv4 peer", none, "203.0.113.9:5555", nil, "203.0.113.9"},
		{"ipv6 peer grouped by /64", none, "[2001:db8:1:2:3:4:5:6]:443", nil, "2001:db8:1:2::/64"},
		{"same /64, another address, same key", none, "[2001:db8:1:2:ffff::1]:443", nil, "2001:db8:1:2::/64"},
		{"ipv6 with zone", none, "[fe80::1%eth0]:80", nil, "fe80::/64"},
		{"ipv4-mapped ipv6 is ipv4", none, "[::ffff:198.51.100.4]:80", nil, "198.51.100.4"},
		{"/56 grouping", httplimit.ClientIP{IPv6Prefix: 56}, "[2001:db8:1:2ff::1]:1", nil, "2001:db8:1:200::/56"},
		{"untrusted peer: spoofed XFF ignored", proxied, "203.0.113.9:1", map[string][]string{"X-Forwarded-For": {"1.1.1.1"}}, "203.0.113.9"},
		{"untrusted peer: spoofed Forwarded ignored", proxied, "203.0.113.9:1", map[string][]string{"Forwarded": {"for=1.1.1.1"}}, "203.0.113.9"},
		{"no proxies configured: XFF ignored", none, "10.1.1.1:1", map[string][]string{"X-Forwarded-For": {"1.1.1.1"}}, "10.1.1.1"},
		{"trusted peer: XFF client", proxied, "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"198.51.100.1"}}, "198.51.100.1"},
		{"trusted chain: rightmost untrusted wins over client-supplied left part", proxied, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"6.6.6.6, 198.51.100.1, 10.0.0.2"}}, "198.51.100.1"},
		{"several XFF lines are one list", proxied, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"6.6.6.6", "198.51.100.1, 192.0.2.7"}}, "198.51.100.1"},
		{"XFF entry with port", proxied, "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"198.51.100.1:4711"}}, "198.51.100.1"},
		{"XFF ipv6 grouped", proxied, "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"2001:db8::7"}}, "2001:db8::/64"},
		{"all hops trusted: outermost", proxied, "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"10.9.9.9, 10.0.0.2"}}, "10.9.9.9"},
		{"trusted peer without header: the peer", proxied, "10.0.0.1:1", nil, "10.0.0.1"},
		{"trusted peer, garbage XFF: no key", proxied, "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"not-an-ip"}}, ""},
		{"trusted peer, empty XFF element: no key", proxied, "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"1.2.3.4,,"}}, ""},
		{"Forwarded quoted ipv6 with port", fwd, "10.0.0.1:1",
			map[string][]string{"Forwarded": {`for="[2001:db8:cafe::17]:4711";proto=https`}}, "2001:db8:cafe::/64"},
		{"Forwarded chain", fwd, "10.0.0.1:1",
			map[string][]string{"Forwarded": {"for=6.6.6.6, For=198.51.100.1;by=10.0.0.1", "for=10.0.0.3"}}, "198.51.100.1"},
		// Exactly one header is believed: a proxy that appends to XFF
		// passes the client's own Forwarded through, and the reverse.
		{"XFF configured: client-sent Forwarded ignored", proxied, "10.0.0.1:1",
			map[string][]string{"Forwarded": {"for=198.51.100.1"}, "X-Forwarded-For": {"198.51.100.2"}}, "198.51.100.2"},
		{"XFF configured, only Forwarded sent: the peer", proxied, "10.0.0.1:1",
			map[string][]string{"Forwarded": {"for=198.51.100.1"}}, "10.0.0.1"},
		{"Forwarded configured: client-sent XFF ignored", fwd, "10.0.0.1:1",
			map[string][]string{"Forwarded": {"for=198.51.100.1"}, "X-Forwarded-For": {"198.51.100.2"}}, "198.51.100.1"},
		{"X-Real-IP configured", realIP, "10.0.0.1:1",
			map[string][]string{"X-Real-IP": {"198.51.100.9"}, "X-Forwarded-For": {"198.51.100.2"}}, "198.51.100.9"},
		{"Forwarded unknown: no key, not a shared bucket", fwd, "10.0.0.1:1", map[string][]string{"Forwarded": {"for=unknown"}}, ""},
		{"Forwarded obfuscated: no key", fwd, "10.0.0.1:1", map[string][]string{"Forwarded": {"for=_hidden"}}, ""},
		{"Forwarded element without for: no key", fwd, "10.0.0.1:1", map[string][]string{"Forwarded": {"proto=https"}}, ""},
		{"Forwarded with comma inside quotes", fwd, "10.0.0.1:1",
			map[string][]string{"Forwarded": {`for=198.51.100.1;ext="a,b"`}}, "198.51.100.1"},
		// An unterminated quote would swallow what the proxy appended.
		{"Forwarded unterminated quote: no key", fwd, "10.0.0.1:1",
			map[string][]string{"Forwarded": {`for=192.0.2.7;by=", for=198.51.100.1`}}, ""},
		{"Forwarded unterminated quote on an earlier line: no key", fwd, "10.0.0.1:1",
			map[string][]string{"Forwarded": {`for=192.0.2.7;by="`, "for=198.51.100.1"}}, ""},
		{"Forwarded escape at the end of a quote: no key", fwd, "10.0.0.1:1",
			map[string][]string{"Forwarded": {`for=192.0.2.7;by="x\`}}, ""},
		{"Forwarded escaped quote inside a quote", fwd, "10.0.0.1:1",
			map[string][]string{"Forwarded": {`for=192.0.2.7;ext="a\"b", for=198.51.100.1`}}, "198.51.100.1"},
		{"unparsable remote address: no key", none, "somewhere", nil, ""},
		{"remote address without a port", none, "192.0.2.44", nil, "192.0.2.44"},
		{"ipv4 with leading zeros is not an address", none, "192.0.02.44:1", nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest("GET", "http://x/", nil)
			r.RemoteAddr = tc.remote
			for k, vs := range tc.headers {
				for _, v := range vs {
					r.Header.Add(k, v)
				}
			}
			got, err := tc.c.Key(r)
			if tc.want == "" {
				if err == nil || !errors.Is(err, httplimit.ErrNoKey) {
					t.Fatalf("Key = %q, %v; want an ErrNoKey error", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Key = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestHeaderKeyAndCompose(t *testing.T) {
	hk := httplimit.HeaderKey("x-api-key")
	r, _ := http.NewRequest("POST", "http://x/v1/things", nil)
	if _, err := hk(r); !errors.Is(err, httplimit.ErrNoKey) {
		t.Fatalf("missing header: err = %v", err)
	}
	r.Header.Set("X-Api-Key", "  ")
	if _, err := hk(r); !errors.Is(err, httplimit.ErrNoKey) {
		t.Fatalf("blank header: err = %v", err)
	}
	r.Header.Set("X-Api-Key", string(make([]byte, httplimit.MaxKeyLen+1)))
	if _, err := hk(r); !errors.Is(err, httplimit.ErrNoKey) {
		t.Fatalf("overlong header: err = %v", err)
	}
	r.Header.Set("X-Api-Key", "k1")
	if k, err := hk(r); err != nil || k != "k1" {
		t.Fatalf("HeaderKey = %q, %v", k, err)
	}
	if k, _ := httplimit.RouteKey(r); k != "POST /v1/things" {
		t.Fatalf("RouteKey = %q", k)
	}
	both := httplimit.Compose(hk, httplimit.RouteKey)
	k1, err := both(r)
	if err != nil || k1 != "2:k1|POST /v1/things" {
		t.Fatalf("Compose = %q, %v", k1, err)
	}
	// Parts that would collide if merely joined do not.
	a := httplimit.Compose(constKey("a|b"), constKey("c"))
	b := httplimit.Compose(constKey("a"), constKey("b|c"))
	ka, _ := a(r)
	kb, _ := b(r)
	if ka == kb {
		t.Fatalf("Compose collides: %q", ka)
	}
	r.Header.Del("X-Api-Key")
	if _, err := both(r); !errors.Is(err, httplimit.ErrNoKey) {
		t.Fatalf("Compose without a part: err = %v", err)
	}
}

// TestRouteKey: one route however it is spelt, bounded in length.
func TestRouteKey(t *testing.T) {
	for _, c := range []struct {
		method string // "" means GET
		target string
		fold   bool
		want   string // "" means ErrNoKey
	}{
		{"", "/a", false, "GET /a"},
		// HEAD is served by GET's handler, so it counts as GET; a method
		// in lower case is one key with its upper case.
		{"HEAD", "/a", false, "GET /a"},
		{"post", "/login", false, "POST /login"},
		{"Post", "/login", false, "POST /login"},
		// Path parameters, which Tomcat, Jetty and Spring strip.
		{"POST", "/login;jsessionid=1", false, "POST /login"},
		{"", "/a;x=1/b;y=2", false, "GET /a/b"},
		{"", "/x/..;/login", false, "GET /login"},
		{"", "/a/", false, "GET /a"},
		{"", "/./a", false, "GET /a"},
		{"", "//a", false, "GET /a"},
		{"", "/b/../a", false, "GET /a"},
		{"", "/../../a", false, "GET /a"},
		{"", "/a%2f", false, "GET /a"},
		{"", "/a%2F.", false, "GET /a"},
		{"", "/A", false, "GET /A"},
		{"", "/A/B", true, "GET /a/b"},
		{"", "/", false, "GET /"},
		{"", "/" + strings.Repeat("x", httplimit.MaxKeyLen), false, ""},
		{"", "/" + strings.Repeat("x/..", 2*httplimit.MaxKeyLen), false, ""},
	} {
		m := c.method
		if m == "" {
			m = "GET"
		}
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(m + " " + c.target + " HTTP/1.1\r\nHost: x\r\n\r\n")))
		if err != nil {
			t.Fatalf("%.40s: %v", c.target, err)
		}
		k, err := httplimit.Route{FoldCase: c.fold}.Key(r)
		if c.want == "" {
			if !errors.Is(err, httplimit.ErrNoKey) {
				t.Errorf("%.40s: %q, %v; want ErrNoKey", c.target, k, err)
			}
			continue
		}
		if err != nil || k != c.want {
			t.Errorf("%.40s (fold %v): %q, %v; want %q", c.target, c.fold, k, err, c.want)
		}
	}
}

// TestHeaderKeyTwice: a key header on two lines names no single key (an
// upstream may believe either line); one line is keyed whole.
func TestHeaderKeyTwice(t *testing.T) {
	hk := httplimit.HeaderKey("X-API-Key")
	r, _ := http.NewRequest("GET", "http://x/", nil)
	r.Header["X-Api-Key"] = []string{"decoy1", "REALKEY"}
	if k, err := hk(r); !errors.Is(err, httplimit.ErrNoKey) {
		t.Errorf("two lines: %q, %v; want ErrNoKey", k, err)
	}
	r.Header["X-Api-Key"] = []string{"AWS4-HMAC-SHA256 Credential=a, Signature=b"}
	if k, err := hk(r); err != nil || k != "AWS4-HMAC-SHA256 Credential=a, Signature=b" {
		t.Errorf("one line with commas: %q, %v", k, err)
	}
}

func constKey(s string) httplimit.KeyFunc {
	return func(*http.Request) (string, error) { return s, nil }
}

// FuzzClientIP feeds arbitrary forwarding headers from a trusted proxy:
// the key function must never panic, and must either fail with ErrNoKey
// or return a key.
func FuzzClientIP(f *testing.F) {
	f.Add("for=1.2.3.4", "1.2.3.4, 10.0.0.1")
	f.Add(`for="[2001:db8::1]:80";by=x, for=unknown`, "")
	f.Add(`for="\"`, ",,,")
	f.Add("", "[::1]:99")
	c := httplimit.ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	f.Fuzz(func(t *testing.T, fwd, xff string) {
		r, _ := http.NewRequest("GET", "http://x/", nil)
		r.RemoteAddr = "10.0.0.1:1"
		if fwd != "" {
			r.Header["Forwarded"] = []string{fwd}
		}
		if xff != "" {
			r.Header["X-Forwarded-For"] = []string{xff}
		}
		k, err := c.Key(r)
		if err != nil && !errors.Is(err, httplimit.ErrNoKey) {
			t.Fatalf("error %v does not wrap ErrNoKey", err)
		}
		if err == nil && k == "" {
			t.Fatal("empty key without error")
		}
	})
}
