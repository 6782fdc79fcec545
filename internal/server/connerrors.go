package server

import (
	"log"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Kinds of connection errors that net/http logs (MetricConnErrors).
const (
	connErrTLS   = "tls_handshake" // a failed TLS handshake
	connErrHTTP2 = "http2"         // an HTTP/2 connection error, a bad preface among them
	connErrOther = "other"         // anything else net/http logs
)

// maxConnErrDetail bounds the error text a connection error logs.
const maxConnErrDetail = 160

// connErrorLog returns the http.Server ErrorLog of listener: each line
// net/http writes (one per failed TLS handshake, bad HTTP/2 preface and
// the like) is counted in MetricConnErrors and logged through s.flood, at
// most once a second per listener and kind, with a count of what was
// held back. One client can fail handshakes as fast as it connects, so
// logging each would flood the log.
func (s *Server) connErrorLog(listener string) *log.Logger {
	w := &connErrWriter{s: s, listener: listener, counts: map[string]prometheus.Counter{}}
	for _, k := range []string{connErrTLS, connErrHTTP2, connErrOther} {
		w.counts[k] = s.metrics.connErrors.WithLabelValues(listener, k)
	}
	return log.New(w, "", 0)
}

// connErrWriter is connErrorLog's writer; counts is read-only once made.
type connErrWriter struct {
	s        *Server
	listener string
	counts   map[string]prometheus.Counter
}

func (w *connErrWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	kind := connErrOther
	switch {
	case strings.HasPrefix(line, "http: TLS handshake error"):
		kind = connErrTLS
	case strings.HasPrefix(line, "http2: "):
		kind = connErrHTTP2
	}
	w.counts[kind].Inc()
	w.s.flood.Log(slog.LevelWarn, "connection error "+w.listener+" "+kind, "connection error",
		"listener", w.listener, "kind", kind, "err", connErrDetail(line, kind))
	return len(p), nil
}

// connErrDetail is the part of a connection error's line that the log
// shows. For a handshake or HTTP/2 error it stops before the first
// quote, bracket or parenthesis: Go prints what the client sent there (a
// bad preface's bytes, unsupported ALPN names). Bytes outside printable
// ASCII become '?', and the text is at most maxConnErrDetail bytes.
// Another line (a handler's panic and its stack) is kept whole.
func connErrDetail(line, kind string) string {
	if kind == connErrOther {
		return line
	}
	if i := strings.IndexAny(line, "\"'[(`"); i >= 0 {
		line = strings.TrimSpace(line[:i]) + " …"
	}
	if len(line) > maxConnErrDetail {
		line = line[:maxConnErrDetail] + "…"
	}
	return strings.Map(func(r rune) rune {
		if r == '…' || (r >= ' ' && r < 0x7f) {
			return r
		}
		return '?'
	}, line)
}
