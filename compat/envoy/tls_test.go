package envoy

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/slidegate/slidegate/internal/tlsfiles/tlstest"
)

// GRPC_SERVER_USE_TLS with GRPC_CLIENT_TLS_CACERT and GRPC_CLIENT_TLS_SAN,
// the same variables given to the pinned peer and to slidegate envoy
// serve (the binary): a client of the CA naming the SAN is served by
// both; a client without a certificate, one naming another SAN, one of
// another CA and a plaintext one are refused by both.
func TestGRPCMutualTLSAsThePeer(t *testing.T) {
	e := needEnv(t)
	certs := t.TempDir()
	ca := tlstest.NewCA(t, "compat CA")
	cert, key := ca.WriteServer(t, certs, "server", "rls")
	caFile := ca.WriteCA(t, certs, "ca")
	root, _ := writeRuntime(t, map[string]string{"a.yaml": "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"})
	sgBin := filepath.Join(t.TempDir(), "slidegate")
	build := exec.Command(cmpOr(os.Getenv("GO"), "go"), "build", "-o", sgBin, "./cmd/slidegate")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building slidegate: %v\n%s", err, out)
	}
	tlsEnv := []string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + e.redis, "USE_STATSD=false", "LOG_LEVEL=warn",
		"HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "EXPIRATION_JITTER_MAX_SECONDS=0", "DISABLE_STATS=true",
		"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=" + cert, "GRPC_SERVER_TLS_KEY=" + key,
		"GRPC_CLIENT_TLS_CACERT=" + caFile, "GRPC_CLIENT_TLS_SAN=envoy.internal"}
	good := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1",
		Certificates: []tls.Certificate{ca.ClientFor(t, "envoy", "envoy.internal")}})
	start := func(name, bin string, extra ...string) string {
		t.Helper()
		grpcPort := freePort(t)
		cmd := exec.Command(bin, extra...)
		cmd.Env = append(append(os.Environ(), tlsEnv...), "PORT="+strconv.Itoa(freePort(t)), "GRPC_PORT="+strconv.Itoa(grpcPort))
		if name == "peer" {
			cmd.Env = append(cmd.Env, "DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(freePort(t)))
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-exited
			if t.Failed() {
				t.Logf("%s output:\n%s", name, out.String())
			}
		})
		addr := fmt.Sprintf("127.0.0.1:%d", grpcPort)
		deadline := time.Now().Add(60 * time.Second)
		for {
			if err := askTLS(addr, good); err == nil {
				return addr
			}
			select {
			case <-exited:
				t.Fatalf("%s exited: %s", name, out.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not serve a good client within 60 s: %v", name, askTLS(addr, good))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	peerAddr := start("peer", filepath.Join(e.bin, "service_cmd"))
	sgAddr := start("slidegate", sgBin, "envoy", "serve")
	other := tlstest.NewCA(t, "another CA")
	for name, c := range map[string]credentials.TransportCredentials{
		"no certificate":   credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}),
		"another SAN":      credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", Certificates: []tls.Certificate{ca.ClientFor(t, "envoy", "someone.else")}}),
		"another CA":       credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", Certificates: []tls.Certificate{other.ClientFor(t, "envoy", "envoy.internal")}}),
		"plaintext client": insecure.NewCredentials(),
	} {
		perr, serr := askTLS(peerAddr, c), askTLS(sgAddr, c)
		if perr == nil || serr == nil {
			t.Errorf("%s: peer %v, slidegate %v; want both refused", name, perr, serr)
		}
	}
}

// askTLS makes one ShouldRateLimit call over a new connection.
func askTLS(addr string, c credentials.TransportCredentials) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(c))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tls",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
	return err
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
