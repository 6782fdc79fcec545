package deploy_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))

// need returns the path of a tool the test runs. Under
// scripts/proxy-env.sh (make test), which installs them, a missing tool
// fails the test; elsewhere it skips it, saying how to get the tool.
func need(t *testing.T, tool string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err == nil {
		return p
	}
	if os.Getenv("SLIDEGATE_PROXY_ENV") != "" {
		t.Fatalf("%s not found although scripts/proxy-env.sh ran: %v", tool, err)
	}
	t.Skipf("%s is not installed: run the test under scripts/proxy-env.sh (make test does), which installs it with apt", tool)
	return ""
}

// freeAddr returns a loopback address nothing listens on now: a port
// that was just bound and released, for a program that binds it itself.
func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

// startOn starts a program on a free loopback port with start and waits
// until it listens there, for up to a minute per try (a loaded machine
// starts programs slowly). A port another program took between freeAddr
// and the start makes the program exit: it is tried again on another port.
// It returns the address.
func startOn(t *testing.T, start func(listen string) (done <-chan struct{}, log func() string)) string {
	t.Helper()
	for try := 1; ; try++ {
		addr := freeAddr(t)
		done, log := start(addr)
		err := listening(addr, done)
		if err == nil {
			return addr
		}
		if try < 5 && strings.Contains(strings.ToLower(log()), "in use") {
			continue
		}
		t.Fatalf("%v:\n%s", err, log())
	}
}

// listening polls addr until it accepts a connection while the program
// (done) still runs, for up to a minute.
func listening(addr string, done <-chan struct{}) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("exited before listening on %s", addr)
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			select {
			case <-done:
				return fmt.Errorf("exited (another program listens on %s)", addr)
			default:
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on %s after a minute", addr)
}

// run starts cmd and stops it (SIGTERM, then SIGKILL after 10 s) at the
// end of the test; the returned channel is closed when it exits.
func run(t *testing.T, cmd *exec.Cmd) <-chan struct{} {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(terminate)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return done
}

// slidegate starts a real slidegate server from the configuration file
// path, on a free loopback port; it returns the main listener's address.
func slidegate(t *testing.T, path string) string {
	t.Helper()
	cfg, err := config.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	s, err := server.New(cfg, server.WithLogger(quiet))
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
	return s.Addr()
}

// readFile returns a file's content or fails the test.
func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// replaceAll replaces each pair's old with new in s, failing when an old
// is absent (the deploy file changed under the test).
func replaceAll(t *testing.T, s string, pairs ...string) string {
	t.Helper()
	for i := 0; i+1 < len(pairs); i += 2 {
		if !strings.Contains(s, pairs[i]) {
			t.Fatalf("%q is not in the file", pairs[i])
		}
		s = strings.ReplaceAll(s, pairs[i], pairs[i+1])
	}
	return s
}
