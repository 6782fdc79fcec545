package loadtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// The capacity slices' HTTP client. vegeta drives the slices (its
// workers, results and metrics), and its client reads every answer
// whole: net/http's transport parses each header line into a map, wraps
// the body in three readers, and hands the body's end back to its read
// loop through a channel. The harness needs only an answer's status (a
// 200 or 204 is allowed, a 429 refused): the decisions themselves are
// recorded at the server and replayed from there. So the slices use
// leanTransport, which writes the request as net/http does (the same
// header lines in the same order) and reads back the status line and
// the Content-Length, skipping every other byte of the answer. The
// client's work then barely depends on the answer's headers and body,
// and a slice measures the server's cost rather than the client's
// parsing of it. Both targets get the same client. The results keep
// each answer's status, latency and error; their bytes in are 0 (the
// body is skipped).

// leanTransport is an HTTP/1.1 round tripper for loopback hosts: at
// most cap(sem) keep-alive connections in all, each answer's body
// skipped by its Content-Length. A request that has no answer within timeout fails.
// It is safe for concurrent use.
type leanTransport struct {
	timeout time.Duration
	dialer  net.Dialer
	sem     chan struct{} // a token per open connection

	mu   sync.Mutex
	idle map[string][]*leanConn // by host
}

// leanConn is one keep-alive connection.
type leanConn struct {
	host     string
	c        net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	deadline time.Time
}

// newLeanClient returns a client on a leanTransport of cfg.Connections
// connections and cfg.Timeout per request. The client itself has no
// timeout: the transport enforces it (with a timeout, net/http's client
// runs a timer goroutine per request for a transport it does not know).
func newLeanClient(cfg Config) *http.Client {
	return &http.Client{Transport: &leanTransport{
		timeout: cfg.Timeout,
		dialer:  net.Dialer{KeepAlive: 30 * time.Second},
		sem:     make(chan struct{}, max(1, cfg.Connections)),
	}}
}

var errLeanBody = errors.New("loadtest: lean transport: an answer without a Content-Length")

// RoundTrip implements http.RoundTripper. The answer's Body is
// http.NoBody: its bytes were read and dropped.
func (t *leanTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	defer func() {
		if req.Body != nil {
			_ = req.Body.Close()
		}
	}()
	if req.URL.Scheme != "http" || req.ContentLength < 0 {
		return nil, fmt.Errorf("loadtest: lean transport: %s %s: only http with a known length", req.Method, req.URL)
	}
	for retried := false; ; retried = true {
		lc, reused, err := t.get(req.Context(), req.URL.Host)
		if err != nil {
			return nil, err
		}
		resp, reuse, answered, err := lc.roundTrip(req, t.timeout)
		if err == nil && reuse {
			t.put(lc)
			return resp, nil
		}
		t.drop(lc)
		// A kept-alive connection that the server closed while it was
		// idle fails before any byte of an answer. net/http's transport
		// then sends the request again on a new connection, and so
		// does this one, once.
		if err != nil && reused && !answered && !retried && req.GetBody != nil {
			if req.Body, err = req.GetBody(); err != nil {
				return nil, err
			}
			continue
		}
		return resp, err
	}
}

// get returns an idle connection (reused), or dials one when fewer than
// the bound are open.
func (t *leanTransport) get(ctx context.Context, host string) (lc *leanConn, reused bool, err error) {
	t.mu.Lock()
	if idle := t.idle[host]; len(idle) > 0 {
		lc := idle[len(idle)-1]
		t.idle[host] = idle[:len(idle)-1]
		t.mu.Unlock()
		return lc, true, nil
	}
	t.mu.Unlock()
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	c, err := t.dialer.DialContext(ctx, "tcp", host)
	if err != nil {
		<-t.sem
		return nil, false, err
	}
	return &leanConn{host: host, c: c, br: bufio.NewReaderSize(c, 4096), bw: bufio.NewWriterSize(c, 4096)}, false, nil
}

func (t *leanTransport) put(lc *leanConn) {
	t.mu.Lock()
	if t.idle == nil {
		t.idle = map[string][]*leanConn{}
	}
	t.idle[lc.host] = append(t.idle[lc.host], lc)
	t.mu.Unlock()
}

func (t *leanTransport) drop(lc *leanConn) {
	_ = lc.c.Close()
	<-t.sem
}

// CloseIdleConnections closes the connections no request is using
// (http.Client.CloseIdleConnections calls it).
func (t *leanTransport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = nil
	t.mu.Unlock()
	for _, conns := range idle {
		for _, lc := range conns {
			t.drop(lc)
		}
	}
}

// roundTrip writes req and reads its answer; reuse says whether the
// connection may carry another request, answered whether any byte of
// an answer was read.
func (lc *leanConn) roundTrip(req *http.Request, timeout time.Duration) (resp *http.Response, reuse, answered bool, err error) {
	// The deadline moves only when half of it has passed: one request
	// then fails between timeout/2 and timeout after it was sent, and
	// the common request costs a clock read, not a timer update.
	if now := time.Now(); timeout > 0 && lc.deadline.Sub(now) < timeout/2 {
		lc.deadline = now.Add(timeout)
		if err := lc.c.SetDeadline(lc.deadline); err != nil {
			return nil, false, false, err
		}
	}
	if err := writeRequest(lc.bw, req); err != nil {
		return nil, false, false, err
	}
	if err := lc.bw.Flush(); err != nil {
		return nil, false, false, err
	}
	if _, err := lc.br.Peek(1); err != nil {
		return nil, false, false, err
	}
	resp, reuse, err = readAnswer(lc.br, req)
	return resp, reuse, true, err
}

// writeRequest writes req as net/http's transport does for a request
// with a body of known length and no trailers: the request line, Host,
// User-Agent, Content-Length, req's headers sorted by name, and
// Accept-Encoding (net/http asks for gzip and would decompress), then
// the body.
func writeRequest(bw *bufio.Writer, req *http.Request) error {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	bw.WriteString(req.Method)
	bw.WriteByte(' ')
	bw.WriteString(req.URL.RequestURI())
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	ua := "Go-http-client/1.1"
	if v, ok := req.Header["User-Agent"]; ok && len(v) > 0 {
		ua = v[0]
	}
	bw.WriteString("\r\nUser-Agent: ")
	bw.WriteString(ua)
	if req.ContentLength > 0 || req.Method == http.MethodPost || req.Method == http.MethodPut {
		bw.WriteString("\r\nContent-Length: ")
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), req.ContentLength, 10))
	}
	bw.WriteString("\r\n")
	var keys [8]string
	ks := keys[:0]
	for k := range req.Header {
		if k != "User-Agent" && k != "Host" && k != "Content-Length" {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	for _, k := range ks {
		for _, v := range req.Header[k] {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	bw.WriteString("Accept-Encoding: gzip\r\n\r\n")
	if req.Body != nil && req.ContentLength > 0 {
		if _, err := io.Copy(bw, req.Body); err != nil {
			return err
		}
	}
	return nil
}

// readAnswer reads one answer to req from br: its status line, its
// Content-Length (and whether the server closes the connection), and
// skips its body.
func readAnswer(br *bufio.Reader, req *http.Request) (resp *http.Response, reuse bool, err error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return nil, false, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return nil, false, fmt.Errorf("loadtest: lean transport: status line %q", line)
	}
	code, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return nil, false, fmt.Errorf("loadtest: lean transport: status line %q", line)
	}
	status := statusText(code, line)
	length, reuse := int64(-1), true
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return nil, false, err
		}
		if len(line) <= 2 {
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon < 0 {
			return nil, false, fmt.Errorf("loadtest: lean transport: header line %q", line)
		}
		// The names the client reads differ in length: a line whose name
		// has none of their lengths is skipped without comparing.
		name, value := line[:colon], line[colon+1:]
		switch len(name) {
		case len("Content-Length"):
			if bytes.EqualFold(name, []byte("Content-Length")) {
				value = bytes.TrimSpace(value)
				if length, err = strconv.ParseInt(string(value), 10, 64); err != nil || length < 0 {
					return nil, false, fmt.Errorf("loadtest: lean transport: Content-Length %q", value)
				}
			}
		case len("Transfer-Encoding"):
			if bytes.EqualFold(name, []byte("Transfer-Encoding")) {
				return nil, false, fmt.Errorf("loadtest: lean transport: Transfer-Encoding %q", bytes.TrimSpace(value))
			}
		case len("Connection"):
			if bytes.EqualFold(name, []byte("Connection")) && bytes.EqualFold(bytes.TrimSpace(value), []byte("close")) {
				reuse = false
			}
		}
	}
	switch {
	case code == http.StatusNoContent || code == http.StatusNotModified || code < 200 || req.Method == http.MethodHead:
		// No body, whatever the headers say.
	case length >= 0:
		if _, err := br.Discard(int(length)); err != nil {
			return nil, false, err
		}
	default:
		return nil, false, errLeanBody
	}
	return &http.Response{
		Status: status, StatusCode: code, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Body: http.NoBody, ContentLength: length, Request: req, Close: !reuse,
	}, reuse, nil
}

// statusText is the Status of an answer whose status line is line: a
// constant for the capacity phase's codes (net/http's own text), else
// the line's.
func statusText(code int, line []byte) string {
	switch code {
	case http.StatusOK:
		return "200 OK"
	case http.StatusNoContent:
		return "204 No Content"
	case http.StatusTooManyRequests:
		return "429 Too Many Requests"
	}
	return string(bytes.TrimRight(line[9:], "\r\n"))
}
