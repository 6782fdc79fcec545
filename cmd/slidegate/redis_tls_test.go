package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/tlsfiles/tlstest"
)

// TestServeRedisTLS runs slidegate serve on a TLS-only redis-server that
// requires client certificates, with the CA, the client certificate and
// the server name in the YAML's store_options: decisions come from Redis.
// Without the CA, serve refuses to start, says the certificate is not
// trusted, and does not print the password.
func TestServeRedisTLS(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed: run make test")
	}
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "slidegate test CA")
	caFile := ca.WriteCA(t, dir, "ca")
	serverCert, serverKey := ca.WriteServerFor(t, dir, "server", "redis.test", "127.0.0.1", "redis.test")
	clientCert, clientKey := ca.WriteClient(t, dir, "client", "slidegate")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("redis-server", "--port", "0", "--tls-port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--requirepass", "tls-serve-s3cret", "--tls-cert-file", serverCert, "--tls-key-file", serverKey,
		"--tls-ca-cert-file", caFile, "--tls-auth-clients", "yes")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	for i := 0; ; i++ {
		out, _ := exec.Command("redis-cli", "--tls", "--cacert", caFile, "--cert", clientCert, "--key", clientKey,
			"-p", port, "-a", "tls-serve-s3cret", "--no-auth-warning", "ping").CombinedOutput()
		if strings.Contains(string(out), "PONG") {
			break
		}
		if i > 250 {
			t.Fatalf("TLS redis-server did not answer: %s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	store := "rediss://:tls-serve-s3cret@" + addr + "/0"
	config := func(tls string) string {
		p := filepath.Join(t.TempDir(), "c.yaml")
		os.WriteFile(p, []byte(fmt.Sprintf(`policies:
  - {name: tiny, limit: 2, window: 60s}
store_options:
  key_prefix: "serve-tls-%d:"
  failure_policy: closed
  timeout: 2s
%s`, time.Now().UnixNano(), tls)), 0o644)
		return p
	}

	cfg := config(fmt.Sprintf("  tls_ca_file: %q\n  tls_cert_file: %q\n  tls_key_file: %q\n  tls_server_name: redis.test\n",
		caFile, clientCert, clientKey))
	srv, stop := startServe(t, "--config", cfg, "--store", store, "--listen", "127.0.0.1:0", "--admin", "off")
	if srv == nil {
		code, stderr := stop()
		t.Fatalf("serve exited %d: %s", code, stderr)
	}
	c := &http.Client{Transport: &http.Transport{}}
	for i, want := range []int{200, 200, 429} {
		resp, err := c.Post("http://"+srv.Addr()+"/v1/allow", "application/json", strings.NewReader(`{"key":"alice","policy":"tiny"}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("request %d: %d %s, want %d", i, resp.StatusCode, body, want)
		}
	}
	c.Transport.(*http.Transport).CloseIdleConnections()
	if code, stderr := stop(); code != 0 {
		t.Errorf("serve exited %d: %s", code, stderr)
	}

	cfg = config(fmt.Sprintf("  tls_cert_file: %q\n  tls_key_file: %q\n", clientCert, clientKey))
	srv, stop = startServe(t, "--config", cfg, "--store", store, "--listen", "127.0.0.1:0", "--admin", "off")
	if srv != nil {
		stop()
		t.Fatal("serve started with a certificate its roots do not trust")
	}
	code, stderr := stop()
	if code == 0 || !strings.Contains(stderr, "not signed by a trusted authority") || strings.Contains(stderr, "tls-serve-s3cret") {
		t.Errorf("untrusted certificate: exit %d, stderr %s; want a failure naming the untrusted certificate, without the password", code, stderr)
	}
	t.Logf("untrusted certificate: exit %d: %s", code, strings.TrimSpace(stderr))
}
