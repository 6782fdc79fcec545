// Package httpkit holds what the server and the httplimit middleware share
// and users of either do not call: the rate-limit header writer
// (HeaderWriter, WriteLimits), the sentinel of a request without a key,
// the HTTP status of a backend error, and the trusted-proxy ranges
// (parsing them and the one check whether an address is inside them).
package httpkit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/slidegate/slidegate/engine"
)

// MaxLimits bounds the limits of one multi-limit decision (a middleware
// tier of WithLimits, a request to the decision API, a remote group): each
// costs a key derivation and a log to lock per request.
const MaxLimits = 16

// DefaultClientIPHeader is the forwarding header a client-IP key reads
// from trusted proxies when none is named: the one nginx, HAProxy and the
// common cloud load balancers append to.
const DefaultClientIPHeader = "X-Forwarded-For"

// DefaultIPv6Prefix is the prefix length IPv6 clients are grouped by: one
// /64 is what a single subscriber usually holds, so limiting per address
// would let one client rotate through 2^64 keys.
const DefaultIPv6Prefix = 64

// ErrNoKey is wrapped by the errors of key functions that cannot derive a
// key from a request (httplimit.ErrNoKey is this value).
var ErrNoKey = errors.New("httplimit: no rate-limit key")

// StatusOf maps a backend error to an HTTP status: 400 for a bad cost, a
// request without a key or a missing tag, 504 for a caller's deadline,
// 503 for anything else (a failed store).
func StatusOf(err error) int {
	switch {
	case errors.Is(err, engine.ErrInvalidCost), errors.Is(err, ErrNoKey), errors.Is(err, engine.ErrNeedsTag):
		return http.StatusBadRequest
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusServiceUnavailable
}

// ParsePrefixes parses CIDR ranges ("10.0.0.0/8", "::1/128"); a bare
// address is a range of one. An IPv4-mapped range ("::ffff:10.0.0.0/104")
// is turned into the IPv4 range it means ("10.0.0.0/8"), since client
// addresses are compared unmapped; one shorter than /96 is an error. The
// errors name the value at fault, without a package prefix, for the
// caller to place (the server: under trusted_proxies).
func ParsePrefixes(ss []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(ss))
	for _, s := range ss {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			if a := p.Addr(); a.Is4In6() {
				if p.Bits() < 96 {
					return nil, fmt.Errorf("%q is an IPv4-mapped range shorter than /96: it covers more than IPv4 addresses", s)
				}
				p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%q is neither a CIDR range nor an IP address", s)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// Trusted reports whether a (unmapped) is inside one of proxies.
func Trusted(proxies []netip.Prefix, a netip.Addr) bool {
	for _, p := range proxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// TrustedPeer reports whether the peer of remoteAddr (a request's
// RemoteAddr, host:port) is inside one of proxies; false when remoteAddr
// names no IP address.
func TrustedPeer(proxies []netip.Prefix, remoteAddr string) bool {
	a, err := ParseHostPort(remoteAddr)
	return err == nil && Trusted(proxies, a)
}

// ParseHostPort parses "1.2.3.4", "1.2.3.4:80", "::1", "[::1]" and
// "[::1]:80" into an unmapped address.
func ParseHostPort(s string) (netip.Addr, error) {
	s = strings.TrimSpace(s)
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), nil
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		s = s[1 : len(s)-1]
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, errors.New("not an IP address")
	}
	return a.Unmap(), nil
}
