package server

import (
	"net"
	"testing"
)

// TestAdminHostsListeningEverywhere: an admin listener on every address
// answers the machine's own addresses (what a scraper sends as Host), and
// still no other name; one on a named address answers that name.
func TestAdminHostsListeningEverywhere(t *testing.T) {
	g, err := newAdminGuard(Config{Admin: "0.0.0.0:9090", AdminHosts: DefaultAdminHosts})
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if h := net.JoinHostPort(n.IP.String(), "9090"); !g.allowHost(h) {
				t.Errorf("Host %s refused", h)
			}
		}
	}
	for _, h := range []string{"rebind.example:9090", "rebind.example", "192.0.2.1:9090"} {
		if g.allowHost(h) {
			t.Errorf("Host %s allowed", h)
		}
	}
	g, err = newAdminGuard(Config{Admin: "admin.internal:9090", AdminHosts: DefaultAdminHosts})
	if err != nil {
		t.Fatal(err)
	}
	if !g.allowHost("Admin.Internal.:9090") || !g.allowHost("127.0.0.1") || g.allowHost("rebind.example") {
		t.Error("admin on a name: that name and loopback only")
	}
}
