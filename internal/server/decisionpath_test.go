package server_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

// TestDecisionAllocs: the decision API's common request (a flat body
// with a Content-Length, a known policy, an allowed decision) allocates
// nothing in the server's handler: no body reader, no request, no key or
// policy string, no header value, no answer buffer.
func TestDecisionAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	cfg, err := config.ParseConfig([]byte("policies:\n  - {name: free, limit: 1000, window: 1h, algorithm: counter}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "off"
	s, err := server.New(cfg, server.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h := s.Handler()
	const keys = 256
	bodies := make([][]byte, keys)
	for i := range bodies {
		bodies[i] = []byte(`{"key":"client-` + strconv.Itoa(i) + `","policy":"free","cost":1}`)
	}
	var rd bytes.Reader
	r, err := http.NewRequest(http.MethodPost, "/v1/allow", io.NopCloser(&rd))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/json")
	w := &reusedWriter{h: http.Header{}}
	i := 0
	serve := func() {
		rd.Reset(bodies[i%keys])
		r.ContentLength = int64(len(bodies[i%keys]))
		i++
		clear(w.h)
		w.code, w.n = 0, 0
		h.ServeHTTP(w, r)
		if w.code != http.StatusOK || w.n == 0 {
			t.Fatalf("status %d, %d body bytes", w.code, w.n)
		}
	}
	// Each key's first request creates its counter in the engine: the
	// measured ones are each key's second, whose RateLimit value (the
	// same remaining count for every key) the header writer has cached
	// after the first of them.
	for range keys {
		serve()
	}
	if n := testing.AllocsPerRun(keys-1, serve); n != 0 {
		t.Errorf("%v allocations per request, want 0", n)
	}
}

// TestBodyBoundWithoutMaxBytesReader: a request whose Content-Length is
// within max_body_bytes is read without http.MaxBytesReader, yet a body
// longer than it says (a handler in front of the server that replaced
// the body) is still cut at the bound: 413, and the connection closes.
func TestBodyBoundWithoutMaxBytesReader(t *testing.T) {
	s := handlerServer(t, "max_body_bytes: 1024\npolicies:\n  - {name: free, limit: 10, window: 1h}\n")
	defer s.Close()
	for _, n := range []int{1024, 1025, 5000} {
		body := `{"key":"` + strings.Repeat("k", n-len(`{"key":""}`)) + `"}`
		r := httptest.NewRequest(http.MethodPost, "/v1/allow", io.NopCloser(strings.NewReader(body)))
		r.Header.Set("Content-Type", "application/json")
		r.ContentLength = 20 // within the bound, and wrong
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, r)
		want := http.StatusOK // 1024 bytes are read whole
		if n > 1024 {
			want = http.StatusRequestEntityTooLarge
		}
		if w.Code != want {
			t.Errorf("%d bytes: status %d, want %d: %s", n, w.Code, want, w.Body)
		}
		if want == http.StatusRequestEntityTooLarge {
			if got := w.Header().Get("Connection"); got != "close" {
				t.Errorf("%d bytes: Connection %q, want close", n, got)
			}
			if !strings.Contains(w.Body.String(), "max_body_bytes ("+strconv.Itoa(1024)+" bytes)") {
				t.Errorf("%d bytes: %s", n, w.Body)
			}
		}
	}
}
