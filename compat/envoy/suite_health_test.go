package envoy

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// eventually polls probe until it returns want (a hang bound of 60 s).
func (c *chk) eventually(what, want string, probe func() string) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := probe()
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			c.errorf("%s: want %s, still %s after 60 s", what, want, got)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// test/server/health_test.go: the HTTP /healthcheck and grpc.health.v1
// answers for the service name "ratelimit", healthy, and with
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED before and after a
// configuration arrives. The Redis component's failure (hc.Fail in the
// peer's tests) is the service's own Redis server stopped.
func TestPeerSuiteHealth(t *testing.T) {
	e := needEnv(t)
	basic := map[string]string{"basic.yaml": peerFixture(t, e, "basic_config.yaml")}
	atLeastOne := map[string]string{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true"}
	redisHealth := map[string]string{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "true"}
	// addConfig copies a configuration into the empty directory.
	addConfig := func(c *chk) {
		if err := os.WriteFile(filepath.Join(c.dir, "basic.yaml"), []byte(basic["basic.yaml"]), 0o644); err != nil {
			c.errorf("%v", err)
		}
	}
	httpHealth := func(c *chk) func() string {
		return func() string {
			code, body := c.healthz()
			if code == 200 && body != "OK" {
				return "200 with body " + body
			}
			if code == 200 {
				return "200 OK"
			}
			return strconv.Itoa(code)
		}
	}
	cases := []suiteCase{
		{name: "TestHealthCheck", files: basic, check: func(c *chk) {
			if code, body := c.healthz(); code != 200 || body != "OK" {
				c.errorf("GET /healthcheck: want 200 \"OK\", got %d %q", code, body)
			}
		}},
		// The Redis component: down, then up again (the peer's
		// REDIS_HEALTH_CHECK_ACTIVE_CONNECTION makes its health follow the
		// connections to Redis).
		{name: "TestHealthCheck/redis_down_and_up", files: basic, ownRedis: true, env: redisHealth,
			check: func(c *chk) {
				if code, body := c.healthz(); code != 200 || body != "OK" {
					c.errorf("GET /healthcheck: want 200 \"OK\", got %d %q", code, body)
				}
				c.redis.stop()
				c.eventually("GET /healthcheck with Redis down", "500", httpHealth(c))
				if err := c.redis.start(); err != nil {
					c.errorf("%v", err)
					return
				}
				c.eventually("GET /healthcheck with Redis up again", "200 OK", httpHealth(c))
			}},
		{name: "TestHealthyWithAtLeastOneConfigLoaded", env: atLeastOne, check: func(c *chk) {
			if code, _ := c.healthz(); code != 500 {
				c.errorf("GET /healthcheck before any configuration: want 500, got %d", code)
			}
			addConfig(c)
			c.eventually("GET /healthcheck once a configuration is loaded", "200 OK", httpHealth(c))
		}},
		{name: "TestGrpcHealthCheck", files: basic, check: func(c *chk) {
			if got := c.grpcHealth("ratelimit"); got != "SERVING" {
				c.errorf("grpc.health.v1 Check(\"ratelimit\"): want SERVING, got %s", got)
			}
		}},
		{name: "TestGrpcHealthCheck/redis_down", files: basic, ownRedis: true, env: redisHealth,
			check: func(c *chk) {
				h := func() string { return c.grpcHealth("ratelimit") }
				if got := h(); got != "SERVING" {
					c.errorf("grpc.health.v1 Check(\"ratelimit\"): want SERVING, got %s", got)
				}
				c.redis.stop()
				c.eventually("grpc.health.v1 Check(\"ratelimit\") with Redis down", "NOT_SERVING", h)
			}},
		{name: "TestGrpcHealthyWithAtLeastOneConfigLoaded", env: atLeastOne, check: func(c *chk) {
			if got := c.grpcHealth("ratelimit"); got != "NOT_SERVING" {
				c.errorf("grpc.health.v1 Check(\"ratelimit\") before any configuration: want NOT_SERVING, got %s", got)
			}
			addConfig(c)
			c.eventually("grpc.health.v1 Check(\"ratelimit\") once a configuration is loaded", "SERVING", func() string { return c.grpcHealth("ratelimit") })
		}},
	}
	runSuite(t, "test/server/health", cases)
}
