// Package tlstest makes certificates for tests: a CA, server certificates
// for loopback or the names a test gives, and client certificates, written
// where the test says.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority of a test.
type CA struct {
	cert *x509.Certificate
	der  []byte
	key  *ecdsa.PrivateKey
}

// serial is atomic because parallel tests make certificates at once.
var serial atomic.Int64

func next() *big.Int { return big.NewInt(serial.Add(1) + 1) }

// NewCA makes a CA named name, valid for a day either side of now.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	der, key := sign(t, &x509.Certificate{Subject: pkix.Name{CommonName: name},
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}, nil)
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{cert: cert, der: der, key: key}
}

// PEM returns the CA's certificate in PEM.
func (ca *CA) PEM() []byte { return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der}) }

// Pool returns a pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// WriteCA writes the CA's certificate to dir/name.pem and returns that path.
func (ca *CA) WriteCA(t testing.TB, dir, name string) string {
	t.Helper()
	f := filepath.Join(dir, name+".pem")
	if err := os.WriteFile(f, ca.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// sign makes a key and a certificate of tmpl for it, valid for a day
// either side of now, signed by ca (nil: self-signed).
func sign(t testing.TB, tmpl *x509.Certificate, ca *CA) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = next()
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-24*time.Hour), time.Now().Add(24*time.Hour)
	parent, signer := tmpl, key
	if ca != nil {
		parent, signer = ca.cert, ca.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

// loopback are the hosts of WriteServer's certificates.
var loopback = []string{"127.0.0.1", "::1", "localhost"}

func (ca *CA) issue(t testing.TB, cn string, usage x509.ExtKeyUsage, hosts []string) ([]byte, []byte) {
	t.Helper()
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: cn},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, key := sign(t, tmpl, ca)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// WriteServer writes a server certificate for 127.0.0.1, ::1 and
// localhost, named cn, to dir/name.pem and its key to dir/name-key.pem.
func (ca *CA) WriteServer(t testing.TB, dir, name, cn string) (certFile, keyFile string) {
	t.Helper()
	return ca.WriteServerFor(t, dir, name, cn, loopback...)
}

// WriteServerFor is WriteServer for the given hosts only: each is an IP
// address or a DNS name.
func (ca *CA) WriteServerFor(t testing.TB, dir, name, cn string, hosts ...string) (certFile, keyFile string) {
	t.Helper()
	c, k := ca.issue(t, cn, x509.ExtKeyUsageServerAuth, hosts)
	return writePair(t, dir, name, c, k)
}

// WriteClient writes a client certificate named cn to dir/name.pem and
// its key to dir/name-key.pem.
func (ca *CA) WriteClient(t testing.TB, dir, name, cn string) (certFile, keyFile string) {
	t.Helper()
	c, k := ca.issue(t, cn, x509.ExtKeyUsageClientAuth, nil)
	return writePair(t, dir, name, c, k)
}

func writePair(t testing.TB, dir, name string, c, k []byte) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	if err := os.WriteFile(certFile, c, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, k, 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// Client returns a client certificate named cn.
func (ca *CA) Client(t testing.TB, cn string) tls.Certificate {
	t.Helper()
	return ca.ClientFor(t, cn)
}

// ClientFor is Client with these subject alternative names (IP addresses
// or DNS names).
func (ca *CA) ClientFor(t testing.TB, cn string, hosts ...string) tls.Certificate {
	t.Helper()
	c, k := ca.issue(t, cn, x509.ExtKeyUsageClientAuth, hosts)
	cert, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}
