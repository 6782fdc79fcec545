package remote_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))

// serve starts a real slidegate server on loopback with one policy per
// p (named p<i> when unnamed), reading clk; it is shut down at the end of
// the test. It returns the main listener's base URL and the policies as
// named.
func serve(t *testing.T, ps []engine.Policy, clk engine.Clock) (string, []engine.Policy, *server.Server) {
	t.Helper()
	var b strings.Builder
	b.WriteString("policies:\n")
	named := append([]engine.Policy(nil), ps...)
	for i, p := range named {
		if p.Name == "" {
			named[i].Name = fmt.Sprintf("p%d", i)
		}
		fmt.Fprintf(&b, "  - name: %s\n    limit: %d\n    window: %s\n    algorithm: %s\n", named[i].Name, p.Limit, p.Window, p.Algorithm)
	}
	cfg, err := config.ParseConfig([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	opts := []server.Option{server.WithLogger(quiet)}
	if clk != nil {
		opts = append(opts, server.WithClock(clk))
	}
	s, err := server.New(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return "http://" + s.Addr(), named, s
}
