package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/slidegate/slidegate/internal/tlsfiles/tlstest"
)

// TestServeTLS runs slidegate serve as a real process with TLS and mutual
// TLS on the main and gRPC listeners, from certificates the test makes:
// clients with a certificate of the CA are served, clients without are
// refused at the handshake, the admin listener stays plain, and a renewed
// certificate is served after SIGHUP.
func TestServeTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "slidegate test CA")
	cert, key := ca.WriteServer(t, dir, "server", "first")
	caFile := filepath.Join(dir, "ca.pem")
	envoy := filepath.Join(dir, "ratelimit.yaml")
	conf := filepath.Join(dir, "slidegate.yaml")
	for path, data := range map[string]string{
		caFile: string(ca.PEM()),
		envoy:  "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1\n",
		conf:   "policies:\n  - {name: free, limit: 2, window: 1h}\n",
	} {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	h := startHelper(t, nil, "--config", conf, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--drain-delay", "0s",
		"--tls-cert", cert, "--tls-key", key, "--tls-client-ca", caFile, "--grpc", "127.0.0.1:0", "--envoy-config", envoy)
	client := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t, "alice")}}

	// post asks the main listener over a new connection; it returns the
	// status and the server certificate's name.
	post := func(cfg *tls.Config) (int, string, error) {
		tr := &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true, ForceAttemptHTTP2: true}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Post("https://"+h.listen+"/v1/allow", "application/json", strings.NewReader(`{"key":"a"}`))
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.TLS.PeerCertificates[0].Subject.CommonName, nil
	}
	if st, cn, err := post(client); err != nil || st != 200 || cn != "first" {
		t.Fatalf("with a client certificate: %d %q %v", st, cn, err)
	}
	if _, _, err := post(&tls.Config{RootCAs: ca.Pool()}); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	resp, err := http.Get("http://" + h.admn + "/readyz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the admin listener over plain HTTP: %v %v", resp, err)
	}
	resp.Body.Close()

	m := grpcAddrRE.FindStringSubmatch(h.logs())
	if m == nil {
		t.Fatalf("no gRPC address in the log:\n%s", h.logs())
	}
	health := func(creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(m[1], grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("gRPC health %v", r.Status)
		}
		return err
	}
	if err := health(credentials.NewTLS(client)); err != nil {
		t.Fatalf("gRPC over mutual TLS: %v", err)
	}
	if err := health(insecure.NewCredentials()); err == nil {
		t.Fatal("gRPC in plaintext was served on the TLS listener")
	}
	if err := health(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool()})); err == nil {
		t.Fatal("gRPC without a client certificate was served")
	}

	// A renewed certificate, then SIGHUP.
	ca.WriteServer(t, dir, "server", "second")
	if err := h.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the renewed certificate", func() bool {
		_, cn, err := post(client)
		return err == nil && cn == "second"
	})
}

// TestLogFormat: --log-format json writes one JSON object a line, at the
// --log-level given; anything but text or json is a usage error.
func TestLogFormat(t *testing.T) {
	var buf bytes.Buffer
	l := newLogger(&buf, "json", slog.LevelWarn)
	l.Info("dropped")
	l.Warn("kept", "policy", "free")
	sc := bufio.NewScanner(&buf)
	var lines []map[string]any
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not JSON: %q: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 1 || lines[0]["msg"] != "kept" || lines[0]["level"] != "WARN" || lines[0]["policy"] != "free" {
		t.Fatalf("json log: %v", lines)
	}
	buf.Reset()
	newLogger(&buf, "text", slog.LevelInfo).Info("hello", "k", "v")
	if !strings.Contains(buf.String(), `level=INFO msg=hello k=v`) {
		t.Errorf("text log: %q", buf.String())
	}
	var stderr bytes.Buffer
	if _, code := parseServeFlags([]string{"--log-format", "xml"}, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), "want text or json") {
		t.Errorf("--log-format xml: exit %d, %q", code, stderr.String())
	}
	// serve itself, with JSON logs: its start line is a JSON object.
	out := &jsonWatch{started: make(chan string, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- serve(ctx, []string{"--listen", "127.0.0.1:0", "--admin", "off", "--drain-delay", "0s", "--log-format", "json"}, io.Discard, out)
	}()
	select {
	case addr := <-out.started:
		if !strings.HasPrefix(addr, "127.0.0.1:") {
			t.Errorf("listen %q", addr)
		}
	case code := <-done:
		t.Fatalf("serve exited %d", code)
	case <-time.After(time.Minute):
		t.Fatal("no JSON start line in a minute")
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit %d", code)
	}
}

// jsonWatch reports the listen address of serve's JSON start line.
type jsonWatch struct {
	started chan string
	seen    bool
}

func (w *jsonWatch) Write(p []byte) (int, error) {
	var m struct{ Msg, Listen string }
	if json.Unmarshal(p, &m) == nil && m.Msg == "slidegate serving" && !w.seen {
		w.seen = true
		w.started <- m.Listen
	}
	return len(p), nil
}
