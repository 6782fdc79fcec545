package envoy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/redisstore"
)

// env is what peer-env.sh and redis-env.sh export.
type env struct {
	bin, src, redis string
}

func needEnv(t *testing.T) env {
	t.Helper()
	e := env{os.Getenv("SLIDEGATE_ENVOY_PEER_BIN"), os.Getenv("SLIDEGATE_ENVOY_PEER_SRC"), os.Getenv("SLIDEGATE_REDIS_ADDR")}
	if e.bin == "" || e.src == "" || e.redis == "" {
		t.Skip("run through make test-envoy (compat/envoy/peer-env.sh and scripts/redis-env.sh set SLIDEGATE_ENVOY_PEER_BIN, SLIDEGATE_ENVOY_PEER_SRC, SLIDEGATE_REDIS_ADDR)")
	}
	return e
}

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// writeRuntime writes files (path relative to the config directory →
// contents) into a fresh runtime tree laid out as the peer reads it:
// ROOT/ratelimit/config/. It returns ROOT and the config directory.
func writeRuntime(t *testing.T, files map[string]string) (root, dir string) {
	t.Helper()
	root = t.TempDir()
	dir = filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root, dir
}

// peer is a running envoyproxy/ratelimit.
type peer struct {
	http   string // the HTTP port's address
	cmd    *exec.Cmd
	client rlsv3.RateLimitServiceClient
	conn   *grpc.ClientConn
	out    *bytes.Buffer
}

// startPeer runs the peer's service on loopback over the runtime tree at
// root, on its own Redis database (flushed first), with extra environment.
func startPeer(t *testing.T, e env, root string, extra map[string]string) *peer {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: e.redis})
	defer rdb.Close()
	if err := rdb.FlushAll(context.Background()).Err(); err != nil { // slidegate's Redis database too
		t.Fatalf("flushing the peer's Redis: %v", err)
	}
	grpcPort, httpPort, debugPort := freePort(t), freePort(t), freePort(t)
	cmd := exec.Command(filepath.Join(e.bin, "service_cmd"))
	cmd.Env = append(os.Environ(),
		"RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+e.redis, "USE_STATSD=false", "LOG_LEVEL=warn",
		"HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
		"PORT="+strconv.Itoa(httpPort), "GRPC_PORT="+strconv.Itoa(grpcPort), "DEBUG_PORT="+strconv.Itoa(debugPort),
		"EXPIRATION_JITTER_MAX_SECONDS=0", "DISABLE_STATS=true")
	for k, v := range extra {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &peer{http: fmt.Sprintf("127.0.0.1:%d", httpPort), cmd: cmd, out: &bytes.Buffer{}}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			out := p.out.String()
			if len(out) > 2000 {
				out = out[:2000] + "…"
			}
			t.Logf("peer output:\n%s", out)
		}
	})
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	p.conn, p.client = conn, rlsv3.NewRateLimitServiceClient(conn)
	// Up when it answers a request for a domain no configuration has.
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := p.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "slidegate-probe", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
		cancel()
		if err == nil {
			return p
		}
		select {
		case <-exited:
			t.Fatalf("the peer exited: %s", p.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the peer did not answer within 60 s: %v\n%s", err, p.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sg is slidegate's rate limit service on a loopback gRPC listener.
type sg struct {
	client rlsv3.RateLimitServiceClient
	cfg    *rls.Config
	r      *rls.Reloader
	conn   *grpc.ClientConn
}

// startSlidegate runs slidegate's service over dir as slidegate envoy
// serve does: on the memory backends, or, with store (a redis:// URL), on
// Redis.
func startSlidegate(t *testing.T, dir string, merge bool, store string, opts ...rls.Option) *sg {
	t.Helper()
	mb := rls.NewMemoryBackends()
	t.Cleanup(func() { _ = mb.Close() })
	factory := mb.Factory
	if store != "" {
		factory = func(cfg *rls.Config) (engine.GroupBackend, func(), error) {
			if len(cfg.Policies()) == 0 {
				return nil, nil, nil
			}
			// A slow call on a loaded machine must not fall back to a
			// fresh local limiter: that would be an answer of another store.
			st, err := redisstore.Open(store, redisstore.WithTimeout(30*time.Second), redisstore.WithFailurePolicy(redisstore.FailClosed))
			if err != nil {
				return nil, nil, err
			}
			ls, err := st.Limiters(cfg.Policies())
			if err != nil {
				st.Close()
				return nil, nil, err
			}
			bs := make([]engine.Backend, len(ls))
			for i, l := range ls {
				bs[i] = l
			}
			g, err := redisstore.NewGroup(ls...)
			if err != nil {
				st.Close()
				return nil, nil, err
			}
			return rls.WithPeek(g, bs), func() { st.Close() }, nil
		}
	}
	r, err := rls.NewReloader(dir, rls.LoadOptions{AllFiles: true, Merge: merge}, factory, nil, nil, opts...)
	if err != nil {
		t.Fatalf("slidegate refused the configuration: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() { r.Watch(ctx, 50*time.Millisecond); close(watched) }()
	gs, hs := rls.NewGRPCServer(r)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		hs.Shutdown()
		gs.GracefulStop()
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("Serve: %v", err)
		}
		cancel()
		<-watched
		_ = r.Close()
	})
	return &sg{client: rlsv3.NewRateLimitServiceClient(conn), cfg: r.Config(), r: r, conn: conn}
}

// checkPeer runs the peer's offline checker on dir: nil when it accepts.
func checkPeer(e env, dir string, merge bool) error {
	args := []string{"-config_dir", dir}
	if merge {
		args = append(args, "-merge_domain_configs")
	}
	out, err := exec.Command(filepath.Join(e.bin, "config_check_cmd"), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, lastLine(string(out)))
	}
	return nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" && !strings.HasPrefix(l, "goroutine") {
			return l
		}
	}
	return ""
}
