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
	"github.com/slidegate/slidegate/redisstore"
	"github.com/slidegate/slidegate/server"
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
	factory := func(_ context.Context, spec server.StoreSpec) ([]engine.Backend, error) {
		st, err := redisstore.Open(spec.URL, redisstore.WithFailurePolicy(redisstore.FailClosed),
			redisstore.WithTimeout(200*time.Millisecond), redisstore.WithDialTimeout(200*time.Millisecond),
			redisstore.WithKeyPrefix(fmt.Sprintf("generic-%d:", time.Now().UnixNano())))
		if err != nil {
			return nil, err
		}
		ls, err := st.Limiters(spec.Policies)
		if err != nil {
			st.Close()
			return nil, err
		}
		out := make([]engine.Backend, len(ls))
		for i, l := range ls {
			out[i] = l
		}
		return out, nil
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
