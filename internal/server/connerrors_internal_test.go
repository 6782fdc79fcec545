package server

import (
	"strings"
	"testing"
)

// TestConnErrDetail: a handshake or HTTP/2 error's text stops where Go
// prints the client's bytes, keeps to printable ASCII and to
// maxConnErrDetail bytes; another line is kept whole.
func TestConnErrDetail(t *testing.T) {
	long := "http: TLS handshake error from 127.0.0.1:1: " + strings.Repeat("x", 300)
	for _, c := range []struct{ line, kind, want string }{
		{"http2: server: error reading preface from client 127.0.0.1:1: bogus greeting \"GET / HTTP/1.1\"", connErrHTTP2,
			"http2: server: error reading preface from client 127.0.0.1:1: bogus greeting …"},
		{"http: TLS handshake error from 127.0.0.1:1: tls: client requested unsupported application protocols ([evil])", connErrTLS,
			"http: TLS handshake error from 127.0.0.1:1: tls: client requested unsupported application protocols …"},
		{"http: TLS handshake error from 127.0.0.1:1: tls: client offered only unsupported versions: [302 301]", connErrTLS,
			"http: TLS handshake error from 127.0.0.1:1: tls: client offered only unsupported versions: …"},
		{"http: TLS handshake error from 127.0.0.1:1: bad \x00\xff byte", connErrTLS, "http: TLS handshake error from 127.0.0.1:1: bad ?? byte"},
		{long, connErrTLS, long[:maxConnErrDetail] + "…"},
		{"http: panic serving 127.0.0.1:1: boom\ngoroutine 1 [running]:", connErrOther, "http: panic serving 127.0.0.1:1: boom\ngoroutine 1 [running]:"},
	} {
		if got := connErrDetail(c.line, c.kind); got != c.want {
			t.Errorf("connErrDetail(%q)\n got %q\nwant %q", c.line, got, c.want)
		}
	}
}
