package server_test

// Log floods: a failing store or upstream is logged
// at most once a second per cause, and what was held back is counted.

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
	"github.com/slidegate/slidegate/redisstore"
)

// countRecords returns how many lines of logs carry msg, how many
// failures they stand for (one for a line written as it came, the
// suppressed count for a line of held-back ones), and how many causes
// (error texts) they name.
func countRecords(t *testing.T, logs, msg string) (lines, records, causes int) {
	t.Helper()
	seen := map[string]bool{}
	for _, l := range strings.Split(logs, "\n") {
		if !strings.Contains(l, "msg="+strconv.Quote(msg)) {
			continue
		}
		lines++
		if _, e, ok := strings.Cut(l, " err="); ok {
			e, _, _ = strings.Cut(e, " suppressed=")
			if !seen[e] {
				seen[e] = true
				causes++
			}
		}
		_, after, ok := strings.Cut(l, "suppressed=")
		if !ok {
			records++
			continue
		}
		n, err := strconv.Atoi(strings.Fields(after)[0])
		if err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		records += n
	}
	return lines, records, causes
}

// flood sends n requests from 4 goroutines and checks each answer's
// status.
func flood(t *testing.T, e *env, n, want int, method, path, body string) {
	t.Helper()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 4 {
				req := fmt.Sprintf(`{"key":"k%d"}`, i)
				if body == "" {
					req = ""
				}
				r := e.do(method, e.base+path, req)
				if r.status != want {
					t.Errorf("request %d: %d, want %d", i, r.status, want)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// checkThrottled checks the log of n failures logged as msg over elapsed:
// per cause at most one line a second (and one more at each end of the
// run), and, once the server is shut down, lines that account for all n.
func checkThrottled(t *testing.T, logs *syncBuffer, shutdown func(), msg string, n int, elapsed time.Duration) {
	t.Helper()
	lines, _, causes := countRecords(t, logs.String(), msg)
	if max := causes * (2 + int(elapsed/time.Second)); lines > max || causes > 8 {
		t.Errorf("%d failures in %v logged on %d lines of %d causes, want at most %d", n, elapsed.Round(time.Millisecond), lines, causes, max)
	}
	shutdown()
	lines, records, _ := countRecords(t, logs.String(), msg)
	if records != n {
		t.Errorf("%d lines account for %d failures, want %d:\n%s", lines, records, n, logs.String())
	}
	t.Logf("%d failures in %v: %d log lines", n, elapsed.Round(time.Millisecond), lines)
}

// startLogged starts a server logging to logs and returns its shutdown.
func startLogged(t *testing.T, cfg config.Config, logs *syncBuffer, opts ...server.Option) (*env, func()) {
	t.Helper()
	opts = append(opts, server.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	e := start(t, cfg, opts...)
	return e, func() {
		e.client.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.srv.Shutdown(ctx)
	}
}

// TestUpstreamFailureLogThrottled: with the upstream down, 400 requests
// answered 502 make a handful of log lines, which count all 400.
func TestUpstreamFailureLogThrottled(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close() // connections to it are refused
	cfg := mustParse(t, "policies:\n  - {name: free, limit: 100000, window: 60s}\n")
	cfg.Upstream = config.UpstreamURL("http://" + down)
	var logs syncBuffer
	e, shutdown := startLogged(t, cfg, &logs, server.WithClock(engine.NewManualClock()))
	const n = 400
	begin := time.Now()
	flood(t, e, n, 502, "GET", "/", "")
	checkThrottled(t, &logs, shutdown, "the upstream is unavailable", n, time.Since(begin))
}

// TestStoreFailureLogThrottled: with the real Redis store's connection
// cut (failure_policy closed), 400 decision API requests answered 503
// make a handful of log lines, which count all 400.
func TestStoreFailureLogThrottled(t *testing.T) {
	addr := os.Getenv("SLIDEGATE_REDIS_ADDR")
	if addr == "" {
		t.Skip("SLIDEGATE_REDIS_ADDR not set: run make test (scripts/redis-env.sh starts Redis)")
	}
	proxy := newCutProxy(t, addr)
	factory := func(_ context.Context, spec server.StoreSpec) (server.Store, error) {
		st, err := redisstore.Open(spec.URL, redisstore.WithFailurePolicy(redisstore.FailClosed),
			redisstore.WithTimeout(200*time.Millisecond), redisstore.WithDialTimeout(200*time.Millisecond),
			redisstore.WithKeyPrefix(fmt.Sprintf("flood-%d:", time.Now().UnixNano())))
		if err != nil {
			return server.Store{}, err
		}
		ls, err := st.Limiters(spec.Policies)
		if err != nil {
			return server.Store{}, err
		}
		out := make([]engine.Backend, len(ls))
		for i, l := range ls {
			out[i] = l
		}
		return server.Store{Backends: out, Close: st.Close}, nil
	}
	cfg := mustParse(t, "store: redis://"+proxy.l.Addr().String()+"/0\npolicies:\n  - {name: free, limit: 100000, window: 60s}\n")
	var logs syncBuffer
	e, shutdown := startLogged(t, cfg, &logs, server.WithStore("redis", factory))
	if r, _ := e.allow(`{"key":"a"}`); r.status != 200 {
		t.Fatalf("through Redis: %d %s", r.status, r.body)
	}
	proxy.cut()
	const n = 400
	begin := time.Now()
	flood(t, e, n, 503, "POST", "/v1/allow", "x")
	checkThrottled(t, &logs, shutdown, "the rate-limit store is unavailable", n, time.Since(begin))
}
