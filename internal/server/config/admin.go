package config

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
)

// DefaultAdminHosts are the Host values the admin listener answers by
// default (admin_hosts): loopback names and addresses, any port. A
// browser sends the page's own name as Host, so a page on another name
// that resolves to the admin address (DNS rebinding) is refused.
var DefaultAdminHosts = []string{"localhost", "127.0.0.0/8", "::1"}

// hostEntry is a host name of admin_hosts (letters, digits, '-' and '.').
var hostEntry = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})?$`)

// validateAdmin checks admin_hosts and admin_token_file.
func validateAdmin(c Config) error {
	for i, h := range c.AdminHosts {
		if _, _, err := ParseAdminHost(h); err != nil {
			return Errorf(fmt.Sprintf("admin_hosts[%d]", i), "%v", err)
		}
	}
	if c.AdminTokenFile != "" && c.Admin == "off" {
		return Errorf("admin_token_file", "set, but the admin listener is off")
	}
	return nil
}

// ParseAdminHost parses one admin_hosts entry: "*", a CIDR range, an IP
// address or a host name.
func ParseAdminHost(h string) (name string, p netip.Prefix, err error) {
	h = strings.TrimSpace(h)
	switch {
	case h == "*":
		return "*", netip.Prefix{}, nil
	case strings.Contains(h, "/"):
		p, err := netip.ParsePrefix(h)
		if err != nil {
			return "", netip.Prefix{}, fmt.Errorf("%q is not a CIDR range", h)
		}
		return "", p.Masked(), nil
	}
	if a, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		return "", netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
	}
	if !hostEntry.MatchString(strings.TrimSuffix(h, ".")) {
		return "", netip.Prefix{}, fmt.Errorf("%q is not a host name, IP address, CIDR range or *", h)
	}
	return strings.ToLower(strings.TrimSuffix(h, ".")), netip.Prefix{}, nil
}
