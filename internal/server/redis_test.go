package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/redisstore"
)

// cutProxy forwards TCP connections to a real server until cut.
type cutProxy struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{l: l}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); io.Copy(u, c); u.Close() }()
			go func() { defer p.wg.Done(); io.Copy(c, u); c.Close() }()
		}
	}()
	return p
}

// cut closes the listener and every connection, and waits.
func (p *cutProxy) cut() {
	p.l.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// TestStoreFailureAnswersGeneric (point 7): when the real Redis store
// cannot decide (its connection cut, failure_policy closed), the client
// gets a 503 that names no address or backend error; the log has them.
func TestStoreFailureAnswersGeneric(t *testing.T) {
	addr := os.Getenv("SLIDEGATE_REDIS_ADDR")
	if addr == "" {
		t.Skip("SLIDEGATE_REDIS_ADDR not set: run make test (scripts/redis-env.sh starts Redis)")
	}
	proxy := newCutProxy(t, addr)
	proxyAddr := proxy.l.Addr().String()
	factory := func(_ context.Context, spec server.StoreSpec) (server.Store, error) {
		st, err := redisstore.Open(spec.URL, redisstore.WithFailurePolicy(redisstore.FailClosed),
			redisstore.WithTimeout(200*time.Millisecond), redisstore.WithDialTimeout(200*time.Millisecond),
			redisstore.WithKeyPrefix(fmt.Sprintf("generic-%d:", time.Now().UnixNano())))
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
	cfg := mustParse(t, "store: redis://"+proxyAddr+"/0\npolicies:\n  - {name: free, limit: 5, window: 60s}\n")
	var logs syncBuffer
	e := start(t, cfg, server.WithStore("redis", factory), server.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if r, _ := e.allow(`{"key":"a"}`); r.status != 200 {
		t.Fatalf("through Redis: %d %s", r.status, r.body)
	}
	proxy.cut()
	r := e.do("POST", e.base+"/v1/allow", `{"key":"a"}`)
	body := string(r.body)
	if r.status != 503 || strings.Contains(body, proxyAddr) || strings.Contains(body, "redis") || !strings.Contains(body, "rate-limit store is unavailable") {
		t.Errorf("store failure: %d %s", r.status, body)
	}
	if !strings.Contains(logs.String(), "redisstore") {
		t.Errorf("the log lacks the store's error:\n%s", logs.String())
	}
}

// TestRedisRoutesAndReload: a gateway route of one limit on real Redis (a
// store without a group needs none for it), and a reload, which opens the
// store again for every policy, keeps the keys' state: it lives in Redis.
// The previous store is closed (goleak checks at the end).
func TestRedisRoutesAndReload(t *testing.T) {
	addr := os.Getenv("SLIDEGATE_REDIS_ADDR")
	if addr == "" {
		t.Skip("SLIDEGATE_REDIS_ADDR not set: run make test (scripts/redis-env.sh starts Redis)")
	}
	prefix := fmt.Sprintf("routes-%d:", time.Now().UnixNano())
	var opened, closed int
	var mu sync.Mutex
	factory := func(_ context.Context, spec server.StoreSpec) (server.Store, error) {
		st, err := redisstore.Open(spec.URL, redisstore.WithKeyPrefix(prefix))
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
		mu.Lock()
		opened++
		mu.Unlock()
		return server.Store{Backends: out, Close: func() error {
			mu.Lock()
			closed++
			mu.Unlock()
			return st.Close()
		}}, nil
	}
	up, hits := upstream(t)
	const conf = `
store: redis://%s/0
upstream: %s
key: header:X-User
policies:
  - {name: free, limit: 100, window: 1h}
  - {name: api, limit: 3, window: 1h}
  - {name: other, limit: %d, window: 1h}
routes:
  - {path: /api, limits: [{policy: api}]}
`
	e := start(t, mustParse(t, fmt.Sprintf(conf, addr, up.URL, 1)), server.WithStore("redis", factory))
	get := func() int {
		return e.do("GET", e.base+"/api/x", "", "X-User", "u1").status
	}
	for i, want := range []int{200, 200} {
		if st := get(); st != want {
			t.Fatalf("request %d: %d", i, st)
		}
	}
	if err := e.srv.Reload(mustParse(t, fmt.Sprintf(conf, addr, up.URL, 2))); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{200, 429} {
		if st := get(); st != want {
			t.Fatalf("after the reload, request %d: %d, want %d: the state lives in Redis", i, st, want)
		}
	}
	if hits.Load() != 3 {
		t.Errorf("the upstream saw %d requests, 3 were allowed", hits.Load())
	}
	// The reload's previous store is closed once its requests are done.
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		o, c := opened, closed
		mu.Unlock()
		if o == 2 && c == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("opened %d stores, closed %d; want 2 and 1", o, c)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
