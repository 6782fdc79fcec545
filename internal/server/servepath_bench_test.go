package server_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/server/config"
)

// BenchmarkServePath is the server's CPU per request through net/http,
// without a network or a client: net/http's server reads b.N pipelined
// requests from an in-memory connection and writes its answers into it.
// The sub-benchmarks serve the same requests with the server's handler
// (allow) and with a no-op handler that reads the body and answers 204
// (noop), as the load test's capacity phase does over loopback. The
// difference of their ns/op (cpu-ns/op beside other work) is what the
// server adds to a request: the capacity phase's figure without vegeta
// and the kernel. A third handler (shape) answers like the server with
// constant headers and body and decides nothing: shape minus noop is
// net/http's cost of writing such an answer (the header map, its copy
// at WriteHeader, the body), allow minus shape the server's own.
// allow+draft and shape+draft are the same with the draft pair
// (RateLimit-Policy, RateLimit) on, decision_headers: {draft: true}:
// allow+draft minus allow is what the pair costs an answer. The keys
// cycle through 4,096 clients of a policy whose limit they stay within,
// so every answer is a 200 with a body. Under callgrind a request is
// some 50 times slower, so a key's entries leave the 1 s window before
// its next visit: allow's count there includes creating and sweeping
// keys, about 800 instructions a request (a 1 h window shows it).
//
//	go test -run '^$' -bench ServePath -benchmem -count 10 ./internal/server
func BenchmarkServePath(b *testing.B) {
	s := benchServer(b, "1s")
	defer s.Close()
	sd := benchServer(b, "1s", "decision_headers: {draft: true}\n")
	defer sd.Close()
	const keys = 1 << 12
	reqs := make([][]byte, keys)
	for i := range reqs {
		body := `{"key":"client-` + strconv.Itoa(i) + `","policy":"free","cost":1}`
		reqs[i] = []byte("POST /v1/allow HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: Go-http-client/1.1\r\n" +
			"Content-Length: " + strconv.Itoa(len(body)) + "\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n" + body)
	}
	noop := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, config.DefaultMaxBodyBytes))
		w.WriteHeader(http.StatusNoContent)
	})
	// shape answers as the server does, with constant headers and body of
	// a decision's size: net/http's own cost of such an answer.
	shapeBody := []byte(`{"allowed":true,"policy":"free","limit":100,"remaining":99,"retry_after_ns":0,"reset_ns":1000000000,"at":123456789012,"retry_after_seconds":0,"reset_seconds":1}` + "\n")
	shapeOf := func(header map[string][]string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, config.DefaultMaxBodyBytes))
			h := w.Header()
			for k, v := range header {
				h[k] = v
			}
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(shapeBody)
		})
	}
	shape := shapeOf(map[string][]string{"Content-Type": {"application/json"}})
	shapeDraft := shapeOf(map[string][]string{
		"Content-Type":     {"application/json"},
		"Ratelimit-Policy": {`"free";q=100;w=1`},
		"Ratelimit":        {`"free";r=99;t=1`},
	})
	for _, c := range []struct {
		name   string
		h      http.Handler
		status string
	}{
		{"noop", noop, "HTTP/1.1 204 "}, {"shape", shape, "HTTP/1.1 200 "}, {"allow", s.Handler(), "HTTP/1.1 200 "},
		{"shape+draft", shapeDraft, "HTTP/1.1 200 "}, {"allow+draft", sd.Handler(), "HTTP/1.1 200 "},
	} {
		b.Run(c.name, func(b *testing.B) {
			conn := &scriptConn{reqs: reqs, n: b.N, closed: make(chan struct{})}
			hs := &http.Server{
				Handler:           c.h,
				ReadHeaderTimeout: config.DefaultReadTimeout,
				ReadTimeout:       config.DefaultReadTimeout,
				WriteTimeout:      config.DefaultWriteTimeout,
				IdleTimeout:       config.DefaultIdleTimeout,
				MaxHeaderBytes:    config.DefaultMaxHeaderBytes,
			}
			lis := &oneConnListener{c: conn, done: make(chan struct{})}
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			served := make(chan error, 1)
			go func() { served <- hs.Serve(lis) }()
			select {
			case <-conn.closed:
			case <-time.After(10 * time.Minute): // a hang bound only
				b.Fatal("the connection was not served")
			}
			cpu := processCPU() - cpu0
			b.StopTimer()
			_ = hs.Close()
			if err := <-served; !errors.Is(err, http.ErrServerClosed) {
				b.Fatal(err)
			}
			if conn.answers != b.N || !bytes.HasPrefix(conn.first, []byte(c.status)) {
				b.Fatalf("%d answers to %d requests, the first %q, want %q", conn.answers, b.N, conn.first, c.status)
			}
			if cpu > 0 {
				b.ReportMetric(cpu/float64(b.N)*1e9, "cpu-ns/op")
			}
		})
	}
}

// scriptConn is a client connection that sends n requests, cycling
// through reqs, as fast as the server reads them, then closes; it keeps
// the start of the first answer and counts answers (net/http flushes
// each answer with one Write when the next request is already buffered,
// so Writes are counted as answers only if each starts with a status line).
type scriptConn struct {
	reqs    [][]byte
	n       int
	sent    int
	cur     []byte
	first   []byte
	answers int
	once    sync.Once
	closed  chan struct{}
}

func (c *scriptConn) Read(p []byte) (int, error) {
	total := 0
	for len(p) > 0 {
		if len(c.cur) == 0 {
			if c.sent == c.n {
				break
			}
			c.cur = c.reqs[c.sent%len(c.reqs)]
			c.sent++
		}
		n := copy(p, c.cur)
		c.cur, p, total = c.cur[n:], p[n:], total+n
	}
	if total == 0 {
		return 0, io.EOF
	}
	return total, nil
}

func (c *scriptConn) Write(p []byte) (int, error) {
	if c.first == nil {
		c.first = append([]byte(nil), p[:min(len(p), 64)]...)
	}
	c.answers += bytes.Count(p, []byte("HTTP/1.1 "))
	return len(p), nil
}

func (c *scriptConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

func (c *scriptConn) LocalAddr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 80} }
func (c *scriptConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
}

func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }

// oneConnListener accepts c once, then blocks until closed.
type oneConnListener struct {
	c        net.Conn
	accepted bool
	once     sync.Once
	done     chan struct{}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	if !l.accepted {
		l.accepted = true
		return l.c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }

// closeCounter is a request body that counts its Close calls.
type closeCounter struct {
	io.Reader
	closes int
}

func (c *closeCounter) Close() error { c.closes++; return nil }

// TestAllowClosesReadBody: the decision API closes a body it has read to
// its end (within max_body_bytes), so that net/http does not read it
// again for its end before the answer; a body over the bound is left to
// net/http, which closes the connection.
func TestAllowClosesReadBody(t *testing.T) {
	s := handlerServer(t, "max_body_bytes: 64\npolicies:\n  - {name: free, limit: 100, window: 1s}\n")
	defer s.Close()
	for _, c := range []struct {
		body   string
		status int
		closes int
	}{
		{`{"key":"alice","policy":"free"}`, http.StatusOK, 1},
		{`{"key":"` + strings.Repeat("a", 80) + `"}`, http.StatusRequestEntityTooLarge, 0},
	} {
		body := &closeCounter{Reader: strings.NewReader(c.body)}
		r := httptest.NewRequest(http.MethodPost, "/v1/allow", nil)
		r.Body, r.ContentLength = body, int64(len(c.body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, r)
		if w.Code != c.status || body.closes != c.closes {
			t.Errorf("%d-byte body: status %d, closed %d times; want %d, %d", len(c.body), w.Code, body.closes, c.status, c.closes)
		}
	}
}
