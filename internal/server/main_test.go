package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/slidegate/slidegate/internal/reference"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

// referenceRecords returns the recorded decisions of one policy in the
// reference verifier's form.
func referenceRecords(rec *recorder, policy string) []reference.Record {
	var out []reference.Record
	for _, r := range rec.Records() {
		if r.Policy == policy {
			out = append(out, reference.Record{
				Key: r.Key, Cost: r.Cost, At: r.Decision.At, Allowed: r.Decision.Allowed,
				Remaining: r.Decision.Remaining, RetryAfter: int64(r.Decision.RetryAfter), Reset: int64(r.Decision.Reset),
			})
		}
	}
	return out
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// quiet is a logger that drops everything below errors.
var quiet = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))

// mustParse parses a YAML configuration and points both listeners at
// free loopback ports.
func mustParse(t *testing.T, yaml string) config.Config {
	t.Helper()
	cfg, err := config.ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	return cfg
}

// env is a started server and a client for it.
type env struct {
	t      *testing.T
	srv    *server.Server
	base   string // http://main
	admin  string // http://admin
	client *http.Client
}

// start builds and starts a server on loopback ports; it is shut down (and
// its goroutines checked by goleak) at the end of the test.
func start(t *testing.T, cfg config.Config, opts ...server.Option) *env {
	t.Helper()
	s, err := server.New(cfg, append([]server.Option{server.WithLogger(quiet)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	e := &env{t: t, srv: s, base: "http://" + s.Addr(), admin: "http://" + s.AdminAddr(), client: &http.Client{Transport: tr}}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return e
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (e *env) do(method, url string, body string, hdr ...string) reply {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if method == "POST" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, b}
}

func (e *env) allow(body string) (reply, server.AllowResponse) {
	e.t.Helper()
	r := e.do("POST", e.base+"/v1/allow", body)
	var ar server.AllowResponse
	if r.status == 200 || r.status == 429 {
		dec := json.NewDecoder(bytes.NewReader(r.body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ar); err != nil {
			e.t.Fatalf("decision body %q: %v", r.body, err)
		}
	}
	return r, ar
}

// run builds a server from cfg and runs it with Run, as slidegate serve
// does, until cancel is called; it returns once the server's listeners
// are bound. runErr receives what Run returned.
func run(t *testing.T, cfg config.Config) (s *server.Server, cancel context.CancelFunc, runErr <-chan error) {
	t.Helper()
	s, err := server.New(cfg, server.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	for s.Addr() == "" || (cfg.Admin != "off" && s.AdminAddr() == "") {
		time.Sleep(time.Millisecond)
	}
	return s, cancel, errc
}
