package httplimit_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/slidegate/slidegate/internal/leakcheck"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// okHandler is the handler behind the middleware in tests.
var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.WriteString(w, "ok")
})

// newServer serves okHandler behind a middleware of b (and opts) on a real
// loopback listener, closed at the end of the test.
func newServer(t *testing.T, b engine.Backend, opts ...httplimit.Option) *httptest.Server {
	t.Helper()
	m, err := httplimit.New(append([]httplimit.Option{httplimit.WithBackend(b)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(okHandler))
	t.Cleanup(srv.Close)
	return srv
}

type testServer = httptest.Server

func startServer(t *testing.T, h http.Handler) *testServer {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}
