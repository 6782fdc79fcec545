// Package tlsfiles serves TLS from certificate, key and client CA files
// that can be read again while serving (slidegate serve's SIGHUP), so
// that a renewed certificate takes effect without a restart.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
)

// Files names the PEM files: the certificate chain and its key, and
// optionally the CAs that sign the certificates clients must present
// (mutual TLS).
type Files struct {
	Cert, Key, ClientCA string
}

// Certs holds the files' current contents. Make it with Load; it is safe
// for concurrent use.
type Certs struct {
	files Files
	cur   atomic.Pointer[loaded]
}

type loaded struct {
	cert *tls.Certificate
	cas  *x509.CertPool // nil: no client certificate asked for
}

// Load reads the files; the error names the file at fault.
func Load(f Files) (*Certs, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("tls: a certificate file and a key file are both required")
	}
	c := &Certs{files: f}
	if err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload reads the files again. On error the previous contents keep
// serving.
func (c *Certs) Reload() error {
	cert, err := tls.LoadX509KeyPair(c.files.Cert, c.files.Key)
	if err != nil {
		return fmt.Errorf("tls: cert_file %s, key_file %s: %w", c.files.Cert, c.files.Key, err)
	}
	l := &loaded{cert: &cert}
	if c.files.ClientCA != "" {
		pem, err := os.ReadFile(c.files.ClientCA)
		if err != nil {
			return fmt.Errorf("tls: client_ca_file: %w", err)
		}
		l.cas = x509.NewCertPool()
		if !l.cas.AppendCertsFromPEM(pem) {
			return fmt.Errorf("tls: client_ca_file %s holds no PEM certificate", c.files.ClientCA)
		}
	}
	c.cur.Store(l)
	return nil
}

// ServerConfig returns a server configuration that takes the certificate
// and client CAs in force at each handshake, offering nextProtos by ALPN
// ("h2", "http/1.1" for HTTP; "h2" for gRPC). TLS 1.2 at least.
func (c *Certs) ServerConfig(nextProtos ...string) *tls.Config {
	protos := append([]string(nil), nextProtos...)
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: protos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			l := c.cur.Load()
			cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: protos, Certificates: []tls.Certificate{*l.cert}}
			if l.cas != nil {
				cfg.ClientCAs, cfg.ClientAuth = l.cas, tls.RequireAndVerifyClientCert
			}
			return cfg, nil
		},
	}
}
