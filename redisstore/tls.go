package redisstore

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// tlsConfig is what the TLS options ask for; build turns it into the
// tls.Config of the connections.
type tlsConfig struct {
	base       *tls.Config // WithTLSConfig
	caFile     string
	certFile   string
	keyFile    string
	serverName string
}

func (c tlsConfig) set() bool {
	return c.base != nil || c.caFile != "" || c.certFile != "" || c.keyFile != "" || c.serverName != ""
}

// build returns the tls.Config for a URL whose scheme asks for TLS (on is
// true; parsed is what the URL said, such as skip_verify), or nil without
// TLS. The roots are the system's (SSL_CERT_FILE and SSL_CERT_DIR are
// honoured) unless a CA file or a WithTLSConfig names others.
func (c tlsConfig) build(parsed *tls.Config, on bool) (*tls.Config, error) {
	if !on {
		if c.set() {
			return nil, fmt.Errorf("%w: TLS options need a rediss://, rediss-cluster:// or rediss-sentinel:// URL", ErrInvalidOption)
		}
		return nil, nil
	}
	var tc *tls.Config
	switch {
	case c.base != nil:
		tc = c.base.Clone()
		if parsed != nil && parsed.InsecureSkipVerify {
			tc.InsecureSkipVerify = true
		}
		if tc.ServerName == "" && parsed != nil {
			tc.ServerName = parsed.ServerName
		}
	case parsed != nil:
		tc = parsed.Clone()
	default:
		tc = &tls.Config{}
	}
	if tc.MinVersion == 0 {
		tc.MinVersion = tls.VersionTLS12
	}
	if c.caFile != "" {
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, fmt.Errorf("%w: TLS CA file: %w", ErrInvalidOption, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: TLS CA file %s holds no PEM certificate", ErrInvalidOption, c.caFile)
		}
		tc.RootCAs = pool
	}
	if (c.certFile == "") != (c.keyFile == "") {
		return nil, fmt.Errorf("%w: a TLS client certificate needs both its certificate and its key file", ErrInvalidOption)
	}
	if c.certFile != "" {
		pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: TLS client certificate: %w", ErrInvalidOption, err)
		}
		tc.Certificates = append(tc.Certificates, pair)
	}
	if c.serverName != "" {
		tc.ServerName = c.serverName
	}
	return tc, nil
}

// tlsHint explains a certificate error at Open.
func tlsHint(err error) string {
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var ci x509.CertificateInvalidError
	var ve *tls.CertificateVerificationError
	switch {
	case errors.As(err, &ua):
		return " (the server's certificate is not signed by a trusted authority: name its CA with tls_ca_file, WithTLSConfig's RootCAs or SSL_CERT_FILE)"
	case errors.As(err, &hn):
		return " (the server's certificate does not name the host dialled: set tls_server_name (or WithTLSConfig's ServerName) to a name it holds)"
	case errors.As(err, &ci):
		return " (the server's certificate is invalid, expired or not for a server)"
	case errors.As(err, &ve):
		return " (the server's certificate could not be verified)"
	}
	return ""
}
