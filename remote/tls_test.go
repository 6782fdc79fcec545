package remote_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
	"github.com/slidegate/slidegate/internal/tlsfiles/tlstest"
	"github.com/slidegate/slidegate/remote"
)

// The client reaches a server that requires mutual TLS through a
// transport of the caller's (WithTransport); without a client
// certificate the server cannot be reached, which the failure policy
// handles like any unreachable server.
func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "test CA")
	cert, key := ca.WriteServer(t, dir, "server", "slidegate")
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.ParseConfig([]byte("policies:\n  - {name: api, limit: 3, window: 1m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "off"
	cfg.TLS = config.TLSConfig{CertFile: cert, KeyFile: key, ClientCAFile: caFile}
	s, err := server.New(cfg, server.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := "https://" + s.Addr()

	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t, "svc")}}}
	defer tr.CloseIdleConnections()
	c := dial(t, base, remote.WithTransport(tr))
	defer c.Close()
	l, _ := c.Limiter(pol)
	d, err := l.Decide(context.Background(), "alice", 1)
	if err != nil || !d.Allowed || d.Remaining != 2 {
		t.Fatalf("over mutual TLS: %+v, %v", d, err)
	}

	bare := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}
	defer bare.CloseIdleConnections()
	nc := dial(t, base, remote.WithTransport(bare), remote.WithFailurePolicy(remote.FailClosed), remote.WithTimeout(time.Minute))
	defer nc.Close()
	nl, _ := nc.Limiter(pol)
	if _, err := nl.Decide(context.Background(), "alice", 1); !errors.Is(err, remote.ErrUnavailable) {
		t.Fatalf("without a client certificate: %v, want ErrUnavailable", err)
	}
}
