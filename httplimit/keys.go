package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/slidegate/slidegate/internal/httpkit"
	"github.com/slidegate/slidegate/internal/reqpath"
)

// KeyFunc derives the rate-limit key of a request. It returns an error
// (wrapping ErrNoKey) when the request carries no usable key; the
// middleware then answers 400 rather than charging a shared bucket.
type KeyFunc func(r *http.Request) (string, error)

// ErrNoKey is wrapped by the errors of key functions that cannot derive a
// key from a request.
var ErrNoKey = httpkit.ErrNoKey

// MaxKeyLen bounds every key the middleware decides on (a header's value,
// a route, and a composed key as a whole) and the keys of slidegate's
// decision API, so that a client cannot make the limiter store
// arbitrarily long keys. A longer key is refused with ErrNoKey (400).
const MaxKeyLen = 1024

// ClientIP derives a key from the client's IP address.
//
// The address is the socket peer's, unless the peer is inside one of the
// TrustedProxies ranges: then the one forwarding header named by Header
// (X-Forwarded-For when empty: the one nginx, HAProxy and the common cloud
// load balancers append to) is read from the right, skipping
// addresses of trusted proxies, and the first untrusted address is the
// client. Exactly one header is believed: a proxy that appends to
// X-Forwarded-For passes a client's own Forwarded header through
// untouched, so reading any other header would let the client choose its
// key. Header "Forwarded" is parsed as RFC 7239 (its for= nodes); any
// other header as a comma-separated list of addresses, as
// X-Forwarded-For is. A Forwarded line whose quoted string does not end
// has no key: the quote would hide the elements proxies appended after
// it. A header sent by an untrusted peer is never read.
// If the chain names no usable address where the client should be
// ("unknown", an obfuscated identifier, garbage), the key cannot be
// derived and Key returns an error.
//
// IPv4 addresses (and IPv4-mapped IPv6) are keyed as themselves; IPv6
// addresses by their IPv6Prefix network (default /64), written like
// "2001:db8:1:2::/64". The zero value trusts no proxy and groups IPv6 by
// /64.
type ClientIP struct {
	// TrustedProxies are the ranges whose forwarding header is believed.
	TrustedProxies []netip.Prefix
	// Header is the forwarding header believed from trusted proxies;
	// "" means X-Forwarded-For.
	Header string
	// IPv6Prefix is the IPv6 grouping, 1 to 128; 0 means 64: one /64 is what a
	// single subscriber usually holds, so limiting per address would let
	// one client rotate through 2^64 keys.
	IPv6Prefix int
}

// Key returns the key of r's client address.
func (c ClientIP) Key(r *http.Request) (string, error) {
	// Fast path, no allocation: an IPv4 peer outside the trusted ranges is
	// keyed by the host part of RemoteAddr itself when net/http wrote it
	// canonically (it always does).
	if host, port, ok := strings.Cut(r.RemoteAddr, ":"); ok && !strings.Contains(port, ":") {
		if a, err := netip.ParseAddr(host); err == nil && a.Is4() && !httpkit.Trusted(c.TrustedProxies, a) {
			var buf [15]byte
			if string(a.AppendTo(buf[:0])) == host {
				return host, nil
			}
		}
	}
	a, err := c.Addr(r)
	if err != nil {
		return "", err
	}
	return c.addrKey(a), nil
}

func (c ClientIP) addrKey(a netip.Addr) string {
	if a.Is4() {
		return a.String()
	}
	bits := c.IPv6Prefix
	if bits <= 0 || bits > 128 {
		bits = httpkit.DefaultIPv6Prefix
	}
	p, _ := a.WithZone("").Prefix(bits)
	return p.String()
}

// Addr returns the client address of r as described on ClientIP.
func (c ClientIP) Addr(r *http.Request) (netip.Addr, error) {
	peer, err := httpkit.ParseHostPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: remote address %q: %v", ErrNoKey, r.RemoteAddr, err)
	}
	if !httpkit.Trusted(c.TrustedProxies, peer) {
		return peer, nil
	}
	var chain []string
	name := http.CanonicalHeaderKey(c.Header)
	if name == "" {
		name = httpkit.DefaultClientIPHeader
	}
	if lines := r.Header.Values(name); len(lines) > 0 {
		if name == "Forwarded" {
			if chain, err = forwardedFor(lines); err != nil {
				return netip.Addr{}, fmt.Errorf("%w: %s (from a trusted proxy): %v", ErrNoKey, name, err)
			}
		} else {
			for _, line := range lines {
				for _, e := range strings.Split(line, ",") {
					chain = append(chain, strings.TrimSpace(e))
				}
			}
		}
	}
	// Walk from the proxy nearest to us outwards.
	client := peer
	for i := len(chain) - 1; i >= 0; i-- {
		a, err := httpkit.ParseHostPort(chain[i])
		if err != nil {
			// The proxies' addresses stay out of the message: the
			// client sees it.
			return netip.Addr{}, fmt.Errorf("%w: forwarded client %q (in %s, from a trusted proxy) is not an IP address", ErrNoKey, chain[i], name)
		}
		client = a
		if !httpkit.Trusted(c.TrustedProxies, a) {
			return a, nil
		}
	}
	// Every hop is trusted: the client is the outermost one (or the proxy
	// itself when it forwarded nothing).
	return client, nil
}

// errUnterminated is a Forwarded line whose quoted string does not end.
var errUnterminated = errors.New("a quoted string does not end")

// forwardedFor extracts the for= node of each element of Forwarded header
// lines (RFC 7239 §4), in order. An element without for= yields "", which
// does not parse as an address. A line with an unterminated quoted string
// is an error: the quote would swallow the elements the proxies appended
// after it, and the client would choose its own address.
func forwardedFor(lines []string) ([]string, error) {
	var out []string
	for _, line := range lines {
		if !quotesClosed(line) {
			return nil, errUnterminated
		}
		for _, elem := range splitQuoted(line, ',') {
			node := ""
			for _, pair := range splitQuoted(elem, ';') {
				k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if !ok || !strings.EqualFold(strings.TrimSpace(k), "for") {
					continue
				}
				v = strings.TrimSpace(v)
				if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
					if u, err := strconv.Unquote(v); err == nil {
						v = u
					} else {
						v = v[1 : len(v)-1]
					}
				}
				node = v
			}
			out = append(out, node)
		}
	}
	return out, nil
}

// quotesClosed reports whether every quoted string of s ends (a
// backslash inside one escapes the next byte, as splitQuoted reads it).
func quotesClosed(s string) bool {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if quoted {
				if i+1 == len(s) {
					return false
				}
				i++
			}
		case '"':
			quoted = !quoted
		}
	}
	return !quoted
}

// splitQuoted splits s at sep outside double quotes.
func splitQuoted(s string, sep byte) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if quoted {
				i++
			}
		case '"':
			quoted = !quoted
		case sep:
			if !quoted {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

// HeaderKey keys requests by the value of a request header, such as an API
// key. A request without the header (or with an empty or overlong value)
// has no key. Neither has one that carries the header on two lines: which
// line an upstream believes differs (Go's Header.Get takes the first, PHP
// the last, Node joins them), so keying on either would let a client send
// a fresh decoy beside its real key on every request; such a request is
// answered 400. A single line is keyed whole, commas included, exactly as
// it is forwarded (an AWS or Digest Authorization value holds commas).
func HeaderKey(name string) KeyFunc {
	canon := http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		v := r.Header[canon]
		if len(v) == 0 || strings.TrimSpace(v[0]) == "" {
			return "", fmt.Errorf("%w: missing header %s", ErrNoKey, canon)
		}
		if len(v) > 1 {
			return "", fmt.Errorf("%w: header %s given more than once", ErrNoKey, canon)
		}
		if len(v[0]) > MaxKeyLen {
			return "", fmt.Errorf("%w: header %s is longer than %d bytes", ErrNoKey, canon, MaxKeyLen)
		}
		return v[0], nil
	}
}

// RouteKey keys requests by route: the ServeMux pattern that matched
// (r.Pattern) when the middleware runs inside a mux, else the method and
// the cleaned URL path (Route{}.Key). Composed with a client key it limits
// each client per route; alone, it limits each route overall.
func RouteKey(r *http.Request) (string, error) { return Route{}.Key(r) }

// Route keys requests by route, bounded so that a client cannot mint keys
// by spelling one path many ways or make the limiter store long ones.
//
// Inside a ServeMux the key is the pattern that matched (r.Pattern),
// which the configuration bounds. Otherwise it is the method and the URL
// path as net/http decoded it (so "/a%2f" is "/a/"), without path
// parameters (";jsessionid=1" and the like, which Tomcat, Jetty and
// Spring strip), cleaned by path.Clean ("/a/", "/./a", "//a" and
// "/b/../a" are all "/a"), and lower-cased when FoldCase is set. The
// method is upper-cased, and HEAD is keyed as GET (servers serve HEAD
// with GET's handler, as ServeMux's "GET /x" pattern matches HEAD). A key
// longer than MaxKeyLen bytes is refused with ErrNoKey.
type Route struct {
	// FoldCase keys "/A" and "/a" as one route. Leave it off when the
	// upstream's paths are case-sensitive and distinct routes differ only
	// in case.
	FoldCase bool
}

// Key returns the route key of r.
func (rt Route) Key(r *http.Request) (string, error) {
	if r.Pattern != "" {
		return r.Pattern, nil
	}
	p := r.URL.Path
	if len(r.Method)+1+len(p) > 4*MaxKeyLen {
		// Not worth cleaning: even dot segments could not bring it under
		// the cap without a pathological amount of work.
		return "", fmt.Errorf("%w: path is longer than %d bytes", ErrNoKey, MaxKeyLen)
	}
	p = reqpath.Clean(p, rt.FoldCase)
	m := r.Method
	if !reqpath.Canonical(m) {
		m = strings.ToUpper(m)
	}
	m = reqpath.Method(m)
	if len(m)+1+len(p) > MaxKeyLen {
		return "", fmt.Errorf("%w: method and cleaned path are longer than %d bytes", ErrNoKey, MaxKeyLen)
	}
	return m + " " + p, nil
}

// Compose keys a request by several key functions at once, for example a
// client key and the route: Compose(HeaderKey("X-API-Key"), RouteKey). The
// parts are length-prefixed, so that no two different tuples of parts
// make the same key. If any part has no key, the request has none.
func Compose(fns ...KeyFunc) KeyFunc {
	fns = append([]KeyFunc(nil), fns...)
	return func(r *http.Request) (string, error) {
		var b strings.Builder
		for i, f := range fns {
			k, err := f(r)
			if err != nil {
				return "", err
			}
			if i == len(fns)-1 {
				b.WriteString(k)
				break
			}
			b.WriteString(strconv.Itoa(len(k)))
			b.WriteByte(':')
			b.WriteString(k)
			b.WriteByte('|')
		}
		return b.String(), nil
	}
}

// ErrAmbiguousTier is wrapped by the error of a request that names its
// tier more than once.
var ErrAmbiguousTier = errors.New("httplimit: ambiguous tier")

// HeaderTier names the tier by a request header, such as X-Plan; a request
// without it gets the default tier. A request carrying the header twice
// (or one value listing several, comma-separated) names no single tier
// and is an error (400), so that no two layers of proxies can disagree on
// which of the values counts.
func HeaderTier(name string) func(*http.Request) (string, error) {
	canon := http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		v := r.Header[canon]
		switch {
		case len(v) == 0:
			return "", nil
		case len(v) > 1 || strings.Contains(v[0], ","):
			return "", fmt.Errorf("%w: header %s given more than once", ErrAmbiguousTier, canon)
		}
		return strings.TrimSpace(v[0]), nil
	}
}
