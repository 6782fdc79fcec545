package server

import (
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"testing"

	"github.com/slidegate/slidegate/internal/server/config"
)

// TestAdminHostsListeningEverywhere: an admin listener on every address
// answers the machine's own addresses (what a scraper sends as Host), and
// still no other name; one on a named address answers that name.
func TestAdminHostsListeningEverywhere(t *testing.T) {
	g, err := newAdminGuard(config.Config{Admin: "0.0.0.0:9090", AdminHosts: config.DefaultAdminHosts})
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
	g, err = newAdminGuard(config.Config{Admin: "admin.internal:9090", AdminHosts: config.DefaultAdminHosts})
	if err != nil {
		t.Fatal(err)
	}
	if !g.allowHost("Admin.Internal.:9090") || !g.allowHost("127.0.0.1") || g.allowHost("rebind.example") {
		t.Error("admin on a name: that name and loopback only")
	}
}

// TestAdminPeerBeyondLoopback runs everywhere, also
// where the machine has no address beyond loopback for
// TestAdminBeyondLoopbackNeedsToken: without a token, key operations and
// pprof answer loopback peers and refuse others; /metrics and the probes
// answer both.
func TestAdminPeerBeyondLoopback(t *testing.T) {
	cfg, err := config.ParseConfig([]byte("admin: 0.0.0.0:9090\npolicies:\n  - {name: free, limit: 2, window: 60s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, c := range []struct {
		peer, path string
		want       int
	}{
		{"192.0.2.7:4000", "/debug/pprof/cmdline", 403},
		{"192.0.2.7:4000", "/debug/pprof/heap", 403},
		{"192.0.2.7:4000", "/admin/keys?key=k", 403},
		{"[2001:db8::1]:4000", "/admin/keys?key=k", 403},
		{"[::ffff:192.0.2.7]:4000", "/debug/pprof/cmdline", 403},
		{"192.0.2.7:4000", "/metrics", 200},
		{"192.0.2.7:4000", "/readyz", 503}, // not started: answered, not refused
		{"127.0.0.1:4000", "/debug/pprof/cmdline", 200},
		{"127.9.9.9:4000", "/admin/keys?key=k", 200},
		{"[::1]:4000", "/admin/keys?key=k", 200},
		{"[::ffff:127.0.0.1]:4000", "/debug/pprof/cmdline", 200},
		{"garbage", "/debug/pprof/cmdline", 403},
	} {
		r := httptest.NewRequest("GET", "http://127.0.0.1:9090"+c.path, nil)
		r.RemoteAddr = c.peer
		w := httptest.NewRecorder()
		s.admin.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("GET %s from %s: %d %.200s, want %d", c.path, c.peer, w.Code, w.Body, c.want)
		}
	}
}
