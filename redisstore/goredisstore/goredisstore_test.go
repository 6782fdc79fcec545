package goredisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/redisstore"
)

// standalone returns the address of a Redis server: make test's (through
// scripts/redis-env.sh), else one this test starts from the installed
// redis-server.
func standalone(t *testing.T) string {
	t.Helper()
	if a := os.Getenv("SLIDEGATE_REDIS_ADDR"); a != "" {
		return a
	}
	return ownServer(t)
}

// ownServer starts a redis-server for one test (one that pauses its
// server must not pause the shared one), stopped at its end.
func ownServer(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed: run `make test`")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	for i := 0; rdb.Ping(context.Background()).Err() != nil; i++ {
		if i > 500 {
			t.Fatal("redis-server did not answer")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return addr
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type storeLimiter struct {
	*redisstore.Limiter
	st *redisstore.Store
}

func (l storeLimiter) Close() error { return l.st.Close() }

var sizes = backendtest.Sizes{Traces: 2, TraceSteps: 300, Goroutines: 4, PerG: 150, Resolution: time.Microsecond}

// TestBackend: a store on a go-redis client, standalone and (under make
// test) cluster, runs the backend suite.
func TestBackend(t *testing.T) {
	clients := map[string]func(t *testing.T) redis.UniversalClient{
		"Standalone": func(t *testing.T) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: standalone(t), ContextTimeoutEnabled: true})
		},
		"Cluster": func(t *testing.T) redis.UniversalClient {
			a := os.Getenv("SLIDEGATE_REDIS_CLUSTER_ADDRS")
			if a == "" {
				t.Skip("no cluster: run `make test` (scripts/redis-env.sh starts one)")
			}
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(a, ","), ContextTimeoutEnabled: true})
		},
	}
	for _, name := range []string{"Standalone", "Cluster"} {
		t.Run(name, func(t *testing.T) {
			rdb := clients[name](t)
			defer rdb.Close()
			c, err := New(rdb)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			backendtest.Run(t, func(t *testing.T, p engine.Policy, clk engine.Clock) engine.Backend {
				n++
				st, err := redisstore.OpenClient("go-redis", c, redisstore.WithClock(clk), redisstore.WithRefusalCache(0),
					redisstore.WithFailurePolicy(redisstore.FailClosed), redisstore.WithTimeout(5*time.Second), redisstore.WithLogger(quiet),
					redisstore.WithKeyPrefix(fmt.Sprintf("goredis-%d-%d:", time.Now().UnixNano(), n)))
				if err != nil {
					t.Fatal(err)
				}
				l, err := st.Limiter(p)
				if err != nil {
					st.Close()
					t.Fatal(err)
				}
				return storeLimiter{l, st}
			}, sizes, engine.SlidingLog, engine.SlidingCounter)
		})
	}
}

// TestNoScript: after SCRIPT FLUSH (on a server of the test's own: the
// shared ones serve other packages' raw EVALSHAs) the store falls back to
// EVAL; Close leaves the client open.
func TestNoScript(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: ownServer(t), ContextTimeoutEnabled: true})
	defer rdb.Close()
	c, err := New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := redisstore.OpenClient("go-redis", c, redisstore.WithFailurePolicy(redisstore.FailClosed), redisstore.WithLogger(quiet),
		redisstore.WithKeyPrefix(fmt.Sprintf("goredis-flush-%d:", time.Now().UnixNano())))
	if err != nil {
		t.Fatal(err)
	}
	l, err := st.Limiter(engine.Policy{Name: "byo", Limit: 2, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Decide(ctx, "k", 1); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Decide(ctx, "k", 1); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Errorf("after SCRIPT FLUSH: %+v %v", d, err)
	}
	st.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Errorf("the caller's client after Store.Close: %v", err)
	}
}

// TestNew refuses clients whose calls the store's deadlines would not
// bound, and rings.
func TestNew(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	if _, err := New(rdb); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
		t.Errorf("no ContextTimeoutEnabled: %v", err)
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	if _, err := New(ring); !errors.Is(err, ErrUnsupported) {
		t.Errorf("ring: %v", err)
	}
	if _, err := New(nil); !errors.Is(err, ErrUnsupported) {
		t.Errorf("nil: %v", err)
	}
}

// TestNoRetry: a go-redis client with retries on (MaxRetries 3) sends a
// script call once even when its deadline passes while the server holds
// it (CLIENT PAUSE WRITE) and its connection is then killed: at most one
// connection is ever seen blocked on EVALSHA, and the request leaves at
// most one entry.
func TestNoRetry(t *testing.T) {
	addr := ownServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: 3})
	defer rdb.Close()
	c, err := New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	st, err := redisstore.OpenClient("go-redis", c, redisstore.WithFailurePolicy(redisstore.FailClosed), redisstore.WithTimeout(time.Second),
		redisstore.WithBreaker(0, 0), redisstore.WithRefusalCache(0), redisstore.WithLogger(quiet),
		redisstore.WithKeyPrefix(fmt.Sprintf("goredis-noretry-%d:", time.Now().UnixNano())))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l, err := st.Limiter(engine.Policy{Name: "once", Limit: 10, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := l.Decide(ctx, "warm", 1); err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	// Held for longer than go-redis's retries would take (backoff up to
	// 512 ms each).
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "3000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := l.Decide(ctx, "victim", 1); done <- err }()
	blocked := map[string]bool{}
	end := time.Now().Add(2500 * time.Millisecond)
	var derr error
	returned := false
	for time.Now().Before(end) {
		list, err := admin.ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(list, "\n") {
			if strings.Contains(line, " flags=b ") && strings.Contains(line, " cmd=evalsha ") {
				id, _, _ := strings.Cut(line, " ")
				if !blocked[id] && len(blocked) == 0 {
					// Break its connection: a client that retries on
					// a broken connection sends the call again.
					admin.Do(ctx, "CLIENT", "KILL", "ID", strings.TrimPrefix(id, "id="))
				}
				blocked[id] = true
			}
		}
		select {
		case derr = <-done:
			returned = true
		default:
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !returned {
		derr = <-done
	}
	admin.Do(ctx, "CLIENT", "UNPAUSE")
	if !errors.Is(derr, redisstore.ErrUnavailable) {
		t.Fatalf("held call: %v, want ErrUnavailable", derr)
	}
	if len(blocked) > 1 {
		t.Fatalf("the script call was sent on %d connections: %v", len(blocked), blocked)
	}
	if _, err := l.Decide(ctx, "after", 1); err != nil {
		t.Fatal(err)
	}
	ks, _, err := l.InspectKey(ctx, "victim")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("held call: %v; connections seen blocked on EVALSHA: %d; entries left: %d", derr, len(blocked), ks.Used)
	if ks.Used > 1 {
		t.Fatalf("one timed-out request left %d entries, want at most 1", ks.Used)
	}
}
