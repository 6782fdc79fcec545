package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

// A server with one policy on free loopback ports, asked twice over its
// decision API. A manual clock keeps the output reproducible.
func Example() {
	cfg, err := config.ParseConfig([]byte(`
policies:
  - {name: free, limit: 1, window: 60s}
`))
	if err != nil {
		panic(err)
	}
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "off"
	srv, err := server.New(cfg, server.WithClock(engine.NewManualClock()), server.WithLogger(quiet))
	if err != nil {
		panic(err)
	}
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Shutdown(context.Background())

	for range 2 {
		resp, err := http.Post("http://"+srv.Addr()+"/v1/allow", "application/json", strings.NewReader(`{"key":"alice"}`))
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// The decision is in the body; the only header by default is
		// Retry-After on a refusal (decision_headers).
		fmt.Printf("%d RateLimit: %q Retry-After: %q\n", resp.StatusCode, resp.Header.Get("RateLimit"), resp.Header.Get("Retry-After"))
		fmt.Print(string(body))
	}
	http.DefaultClient.CloseIdleConnections()
	// Output:
	// 200 RateLimit: "" Retry-After: ""
	// {"allowed":true,"policy":"free","limit":1,"remaining":0,"retry_after_ns":0,"reset_ns":60000000000,"at":0,"retry_after_seconds":0,"reset_seconds":60}
	// 429 RateLimit: "" Retry-After: "60"
	// {"allowed":false,"policy":"free","limit":1,"remaining":0,"retry_after_ns":60000000000,"reset_ns":60000000000,"at":0,"retry_after_seconds":60,"reset_seconds":60}
}

// The server as a gateway: requests are keyed by an API key header,
// limited to 1 per 60 s, and the allowed ones proxied to the upstream.
func Example_gateway() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "hello from the upstream")
	}))
	defer upstream.Close()

	cfg, err := config.ParseConfig([]byte(`
key: header:X-API-Key
policies:
  - {name: free, limit: 1, window: 60s}
`))
	if err != nil {
		panic(err)
	}
	cfg.Listen, cfg.Admin, cfg.Upstream = "127.0.0.1:0", "off", config.UpstreamURL(upstream.URL)
	srv, err := server.New(cfg, server.WithClock(engine.NewManualClock()), server.WithLogger(quiet))
	if err != nil {
		panic(err)
	}
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Shutdown(context.Background())

	client := &http.Client{}
	defer client.CloseIdleConnections()
	for _, apiKey := range []string{"alice", "alice", "bob", ""} {
		req, _ := http.NewRequest("GET", "http://"+srv.Addr()+"/hello", nil)
		if apiKey != "" {
			req.Header.Set("X-API-Key", apiKey)
		}
		resp, err := client.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		text := strings.TrimSpace(string(body))
		if resp.StatusCode != http.StatusOK { // application/problem+json
			var p httplimit.Problem
			if err := json.Unmarshal(body, &p); err != nil {
				panic(err)
			}
			text = p.Detail
		}
		fmt.Printf("%q %d RateLimit: %q %s\n", apiKey, resp.StatusCode, resp.Header.Get("RateLimit"), text)
	}
	// Output:
	// "alice" 200 RateLimit: "\"free\";r=0;t=60" hello from the upstream
	// "alice" 429 RateLimit: "\"free\";r=0;t=60" rate limit of policy "free" (1 per 1m0s) exceeded; retry in 60 s
	// "bob" 200 RateLimit: "\"free\";r=0;t=60" hello from the upstream
	// "" 400 RateLimit: "" httplimit: no rate-limit key: missing header X-Api-Key
}
