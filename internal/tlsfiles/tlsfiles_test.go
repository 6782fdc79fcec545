package tlsfiles_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/tlsfiles"
	"github.com/slidegate/slidegate/internal/tlsfiles/tlstest"
)

// handshake dials a TLS listener served with cfg and returns the server
// certificate's common name, or why the two sides did not agree: the
// server writes "ok" after its handshake succeeds, and the client reads it
// (under TLS 1.3 a refused client certificate shows only then).
func handshake(t *testing.T, cfg *tls.Config, client *tls.Config) (string, error) {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := lis.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if c.(*tls.Conn).Handshake() == nil {
			_, _ = c.Write([]byte("ok"))
		}
	}()
	defer func() { lis.Close(); <-done }()
	c, err := tls.Dial("tcp", lis.Addr().String(), client)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil {
		return "", err
	}
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

func TestReloadAndClientCA(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "test CA")
	ca.WriteServer(t, dir, "server", "first")
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	certs, err := tlsfiles.Load(tlsfiles.Files{Cert: filepath.Join(dir, "server.pem"), Key: filepath.Join(dir, "server-key.pem"), ClientCA: caFile})
	if err != nil {
		t.Fatal(err)
	}
	cfg := certs.ServerConfig("h2")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM())
	withCert := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{ca.Client(t, "alice")}}
	if name, err := handshake(t, cfg, withCert); err != nil || name != "first" {
		t.Fatalf("with a client certificate: %q, %v", name, err)
	}
	if _, err := handshake(t, cfg, &tls.Config{RootCAs: pool}); err == nil {
		t.Fatal("a client without a certificate was accepted")
	}
	other := tlstest.NewCA(t, "other CA")
	if _, err := handshake(t, cfg, &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{other.Client(t, "mallory")}}); err == nil {
		t.Fatal("a client certificate of another CA was accepted")
	}
	// A renewed certificate takes effect at Reload; a broken file leaves
	// the one in force.
	ca.WriteServer(t, dir, "server", "second")
	if err := certs.Reload(); err != nil {
		t.Fatal(err)
	}
	if name, err := handshake(t, cfg, withCert); err != nil || name != "second" {
		t.Fatalf("after reload: %q, %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "server-key.pem"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := certs.Reload(); err == nil || !strings.Contains(err.Error(), "key_file") {
		t.Fatalf("reload of a broken key: %v", err)
	}
	if name, err := handshake(t, cfg, withCert); err != nil || name != "second" {
		t.Fatalf("after a failed reload: %q, %v", name, err)
	}
}

func TestLoadErrors(t *testing.T) {
	if _, err := tlsfiles.Load(tlsfiles.Files{Cert: "a.pem"}); err == nil {
		t.Error("no key: no error")
	}
	if _, err := tlsfiles.Load(tlsfiles.Files{Cert: "/nonexistent/a.pem", Key: "/nonexistent/b.pem"}); err == nil || !strings.Contains(err.Error(), "/nonexistent/a.pem") {
		t.Errorf("missing files: %v", err)
	}
}
