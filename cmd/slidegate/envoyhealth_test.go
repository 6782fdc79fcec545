package main

import (
	"context"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// REDIS_HEALTH_CHECK_ACTIVE_CONNECTION, as the peer's: /healthcheck and
// gRPC health for "ratelimit" are healthy while Redis answers, unhealthy
// once it is killed, and healthy again once it is back on its port.
func TestEnvoyServeRedisHealth(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed: run make test")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	dir := t.TempDir()
	var redis *exec.Cmd
	startRedis := func() {
		t.Helper()
		redis = exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
		if err := redis.Start(); err != nil {
			t.Fatal(err)
		}
		for i := 0; ; i++ {
			if out, _ := exec.Command("redis-cli", "-p", port, "ping").CombinedOutput(); strings.Contains(string(out), "PONG") {
				return
			}
			if i > 1500 {
				t.Fatal("redis-server did not answer within 30 s")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	killRedis := func() {
		if redis != nil {
			_ = redis.Process.Kill()
			_ = redis.Wait()
			redis = nil
		}
	}
	startRedis()
	defer killRedis()
	writeFile(t, dir+"/config/a.yaml", oneRule)
	env := map[string]string{"RUNTIME_ROOT": dir, "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "HOST": "127.0.0.1", "PORT": "0",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": addr, "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "true"}
	grpcAddr, httpAddr, stop := startEnvoyServe(t, env)
	defer stop()
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	state := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
		if err != nil {
			return err.Error()
		}
		cl := &http.Client{Timeout: 10 * time.Second}
		resp, err := cl.Get("http://" + httpAddr + "/healthcheck")
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		return r.Status.String() + " " + resp.Status
	}
	await := func(want string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second) // a hang bound
		for {
			got := state()
			if got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("health %q, want %q after 60 s", got, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	await("SERVING 200 OK")
	killRedis()
	await("NOT_SERVING 500 Internal Server Error")
	startRedis()
	await("SERVING 200 OK")
}
