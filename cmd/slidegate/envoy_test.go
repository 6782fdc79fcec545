package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/slidegate/slidegate/internal/server/config"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// slidegate envoy serve, configured by the peer's environment variables
// alone: the runtime directory, a file copied in put in force, the HTTP
// endpoints, on the memory store and on Redis.
func TestEnvoyServeFromEnvironment(t *testing.T) {
	stores := map[string]map[string]string{"memory": {}}
	if addr := os.Getenv("SLIDEGATE_REDIS_ADDR"); addr != "" {
		stores["redis"] = map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": addr}
	}
	for name, extra := range stores {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "ratelimit", "config")
			domain := "envtest-" + name + "-" + time.Now().Format("150405.000000")
			writeFile(t, filepath.Join(dir, "a.yaml"), "domain: "+domain+"\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
			env := map[string]string{"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0",
				"HOST": "127.0.0.1", "PORT": "0", "LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LOG_LEVEL": "info", "USE_STATSD": "false"}
			for k, v := range extra {
				env[k] = v
			}
			addrs := make(chan [2]string, 1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var stderr syncBuf
			done := make(chan int, 1)
			go func() {
				done <- envoyMain(ctx, []string{"serve", "--watch-interval", "50ms"}, func(k string) string { return env[k] }, io.Discard, &stderr,
					func(g, h string) { addrs <- [2]string{g, h} })
			}()
			var a [2]string
			select {
			case a = <-addrs:
			case code := <-done:
				t.Fatalf("exited %d: %s", code, stderr.String())
			}
			conn, err := grpc.NewClient(a[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			c := rlsv3.NewRateLimitServiceClient(conn)
			ask := func(d string) *rlsv3.RateLimitResponse {
				t.Helper()
				r, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: d,
					Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			if r := ask(domain); r.OverallCode != rlsv3.RateLimitResponse_OK || len(r.ResponseHeadersToAdd) != 3 {
				t.Fatalf("first: %v", r)
			}
			if r := ask(domain); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("second: %v", r)
			}
			// A file copied into the runtime directory is in force soon.
			writeFile(t, filepath.Join(dir, "b.yaml"), "domain: "+domain+"-b\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
			deadline := time.Now().Add(30 * time.Second)
			for ask(domain + "-b").Statuses[0].CurrentLimit == nil {
				if time.Now().After(deadline) {
					t.Fatalf("b.yaml not loaded within 30 s: %s", stderr.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
			if r := ask(domain); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("the unchanged rule lost its state on reload: %v", r)
			}
			// A check (hits_addend 0) shows the state, charging nothing.
			check := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "fresh"}}, HitsAddend: wrapperspb.UInt64(0)}
			for range 2 {
				r, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain + "-b", Descriptors: []*ratelimitv3.RateLimitDescriptor{check}})
				if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 5 {
					t.Fatalf("check: %v %v", r, err)
				}
			}
			checks := map[string]string{"/healthcheck": "OK", "/rlconfig": domain + ".k: unit=MINUTE requests_per_unit=1", "/metrics": `slidegate_config_reloads_total{result="success",surface="rls"}`}
			if name == "redis" {
				checks["/metrics?redis"] = "slidegate_redis_"
			}
			for path, want := range checks {
				resp, err := http.Get("http://" + a[1] + path)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
					t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
				}
			}
			resp, err := http.Post("http://"+a[1]+"/json", "application/json", strings.NewReader(`{"domain":"`+domain+`","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("/json: %d", resp.StatusCode)
			}
			cancel()
			if code := <-done; code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
		})
	}
}

// slidegate envoy check refuses what serve refuses, with the same
// message, and accepts what it accepts.
func TestEnvoyCheckAsServe(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "config")
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 4294967295}\n")
	env := map[string]string{"RUNTIME_ROOT": root, "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "PORT": "off"}
	getenv := func(k string) string { return env[k] }
	var out, errb bytes.Buffer
	if code := envoyMain(context.Background(), []string{"check"}, getenv, &out, &errb, nil); code != 0 || !strings.Contains(out.String(), "warning: ") || !strings.Contains(out.String(), "ok: ") {
		t.Fatalf("check: %d %s %s", code, out.String(), errb.String())
	}
	writeFile(t, filepath.Join(dir, "sub", ".hidden.yaml"), "domain: d\n")
	out.Reset()
	errb.Reset()
	if code := envoyMain(context.Background(), []string{"check"}, getenv, &out, &errb, nil); code != 1 || !strings.Contains(errb.String(), `.hidden.yaml:1: domain "d" is configured twice`) {
		t.Fatalf("check of a duplicate: %d %s", code, errb.String())
	}
	checkMsg := strings.TrimPrefix(strings.TrimSpace(errb.String()), "slidegate envoy check: ")
	var serveErr bytes.Buffer
	if code := envoyMain(context.Background(), []string{"serve"}, getenv, io.Discard, &serveErr, nil); code != 1 || !strings.Contains(serveErr.String(), checkMsg) {
		t.Fatalf("serve: %d %s, want %q", code, serveErr.String(), checkMsg)
	}
	// RUNTIME_IGNOREDOTFILES and MERGE_DOMAIN_CONFIG change both alike.
	env["RUNTIME_IGNOREDOTFILES"] = "true"
	if code := envoyMain(context.Background(), []string{"check"}, getenv, io.Discard, &errb, nil); code != 0 {
		t.Fatalf("dot files ignored: %d", code)
	}
	env["RUNTIME_IGNOREDOTFILES"] = ""
	env["MERGE_DOMAIN_CONFIG"] = "true"
	if code := envoyMain(context.Background(), []string{"check", dir}, getenv, io.Discard, &errb, nil); code != 0 {
		t.Fatalf("merged: %d", code)
	}
}

// The peer's largest requests_per_unit over a day, on the counter, is a
// configuration check accepts with the Redis store as with memory (the
// Redis counter's arithmetic is exact for it).
func TestEnvoyCheckRedisCounter(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "config")
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 4294967295}\n")
	env := map[string]string{"RUNTIME_ROOT": root, "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "PORT": "off"}
	getenv := func(k string) string { return env[k] }
	for _, store := range []string{"memory", "redis"} {
		if store == "redis" {
			env["REDIS_SOCKET_TYPE"], env["REDIS_URL"] = "tcp", "127.0.0.1:1"
		}
		var out, errb bytes.Buffer
		if code := envoyMain(context.Background(), []string{"check"}, getenv, &out, &errb, nil); code != 0 || !strings.Contains(out.String(), "ok: ") {
			t.Fatalf("%s: %d %s %s", store, code, out.String(), errb.String())
		}
	}
}

func TestPeerRedisURL(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379"}, "redis://redis:6379"},
		{map[string]string{"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": "/var/run/r.sock"}, "unix:///var/run/r.sock"},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_TLS": "true", "REDIS_AUTH": "user:pw"}, "rediss://user:pw@r:6379"},
		{map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": "a:1,b:2"}, "redis-cluster://a:1,b:2"},
		{map[string]string{"REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,s1:26379,s2:26379"}, "redis-sentinel://s1:26379,s2:26379?master_set=mymaster"},
	} {
		p, errs := readPeerEnv(func(k string) string { return c.env[k] })
		if len(errs) > 0 {
			t.Fatalf("%v: %v", c.env, errs[0].err)
		}
		got, err := peerRedisURL(p.Redis)
		if err != nil || got != c.want {
			t.Errorf("%v: %q %v, want %q", c.env, got, err, c.want)
		}
	}
}

// slidegate serve --listen off --admin off runs the rate limit service
// alone; --listen off without --grpc is refused.
func TestServeListenOff(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "rl.yaml")
	writeFile(t, cfg, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	client, stop := serveEnvoy(t, "--listen", "off", "--admin", "off", "--grpc", "127.0.0.1:0", "--envoy-config", cfg, "--drain-delay", "0s")
	defer stop()
	r, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("%v %v", r, err)
	}
	var stderr bytes.Buffer
	if code := serve(context.Background(), []string{"--listen", "off"}, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), "--listen off needs --grpc") {
		t.Fatalf("--listen off alone: %d %s", code, stderr.String())
	}
}

// peerEnv is the one reader of the peer's environment: its env tags are
// exactly the variables envoy serve honours, each flag tag names a flag
// of both subcommands, and every field takes a value from its variable.
func TestPeerEnvStruct(t *testing.T) {
	var fields []reflect.StructField
	peerFields(reflect.TypeFor[peerEnv](), nil, func(f reflect.StructField) { fields = append(fields, f) })
	var tags []string
	for _, name := range []string{"serve", "check"} {
		fs, _, _ := envoyCmdFlags(name, func(string) string { return "" }, io.Discard)
		for _, field := range fields {
			f := field.Tag.Get("flag")
			if f == "" {
				continue
			}
			if fl := fs.Lookup(f); fl == nil {
				t.Errorf("%s: flag tag %q names no flag of envoy %s", field.Name, f, name)
			} else if env := field.Tag.Get("env"); !strings.Contains(fl.Usage, env) {
				t.Errorf("envoy %s --%s: help %q does not name %s", name, f, fl.Usage, env)
			}
		}
	}
	valid := map[reflect.Type]string{reflect.TypeFor[string](): "x", reflect.TypeFor[bool](): "true",
		reflect.TypeFor[float64](): "0.5", reflect.TypeFor[config.Duration](): "3m"}
	def := reflect.ValueOf(defaultPeerEnv())
	for _, f := range fields {
		name := f.Tag.Get("env")
		tags = append(tags, name)
		p, errs := readPeerEnv(func(k string) string {
			if k == name {
				return valid[f.Type]
			}
			return ""
		})
		if len(errs) > 0 || reflect.ValueOf(p).FieldByIndex(f.Index).Equal(def.FieldByIndex(f.Index)) {
			t.Errorf("%s=%q: field %s unchanged (%v)", name, valid[f.Type], f.Name, errs)
		}
		if f.Type == reflect.TypeFor[string]() {
			continue
		}
		_, errs = readPeerEnv(func(k string) string {
			if k == name {
				return "not-a-value"
			}
			return ""
		})
		if len(errs) != 1 || errs[0].flag != f.Tag.Get("flag") || !strings.Contains(errs[0].err.Error(), name) {
			t.Errorf("%s=not-a-value: %v, want one error naming it", name, errs)
		}
	}
	slices.Sort(tags)
	if want := slices.Sorted(slices.Values(envoyHonoured)); !slices.Equal(tags, want) {
		t.Errorf("peerEnv reads %v,\nenvoy serve honours %v", tags, want)
	}
}
