package httpkit

import (
	"net/netip"
	"testing"
)

func TestParsePrefixes(t *testing.T) {
	got, err := ParsePrefixes([]string{"10.1.2.3/8", " ::1 ", "::ffff:10.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("10.0.0.1/32")}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("prefix %d = %v, want %v", i, got[i], want[i])
		}
	}
	// An IPv4-mapped range means the IPv4 range: client addresses are
	// compared unmapped, so the mapped form would never match.
	mapped, err := ParsePrefixes([]string{"::ffff:10.0.0.0/104", "::ffff:192.0.2.7/128"})
	if err != nil || len(mapped) != 2 || mapped[0] != netip.MustParsePrefix("10.0.0.0/8") || mapped[1] != netip.MustParsePrefix("192.0.2.7/32") {
		t.Errorf("mapped ranges: %v %v", mapped, err)
	}
	if _, err := ParsePrefixes([]string{"::ffff:0:0/95"}); err == nil {
		t.Error("a mapped range shorter than /96 accepted")
	}
	if _, err := ParsePrefixes([]string{"10.0.0.0/33"}); err == nil {
		t.Error("10.0.0.0/33 accepted")
	}
	if _, err := ParsePrefixes([]string{"example.com"}); err == nil {
		t.Error("a host name accepted")
	}
}

func TestTrustedPeer(t *testing.T) {
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	for remote, want := range map[string]bool{
		"10.1.2.3:80": true, "10.1.2.3": true, "[::1]:9": true, "[::ffff:10.0.0.1]:9": true,
		"192.0.2.1:80": false, "[::2]:9": false, "": false, "example.com:80": false,
	} {
		if got := TrustedPeer(proxies, remote); got != want {
			t.Errorf("TrustedPeer(%q) = %v, want %v", remote, got, want)
		}
	}
}
