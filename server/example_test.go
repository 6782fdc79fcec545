package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/server"
)

// A server with one policy on free loopback ports, asked twice over its
// decision API. A manual clock keeps the output reproducible.
func Example() {
	cfg, err := server.ParseConfig([]byte(`
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
		fmt.Printf("%d RateLimit: %s Retry-After: %q\n", resp.StatusCode, resp.Header.Get("RateLimit"), resp.Header.Get("Retry-After"))
		fmt.Print(string(body))
	}
	http.DefaultClient.CloseIdleConnections()
	// Output:
	// 200 RateLimit: "free";r=0;t=60 Retry-After: ""
	// {"allowed":true,"policy":"free","limit":1,"remaining":0,"retry_after_ns":0,"reset_ns":60000000000,"at":0,"retry_after_seconds":0,"reset_seconds":60}
	// 429 RateLimit: "free";r=0;t=60 Retry-After: "60"
	// {"allowed":false,"policy":"free","limit":1,"remaining":0,"retry_after_ns":60000000000,"reset_ns":60000000000,"at":0,"retry_after_seconds":60,"reset_seconds":60}
}
