// Package server is slidegate's HTTP server, what `slidegate serve` runs:
// a decision API, or a rate-limiting reverse proxy (gateway), on one
// listener, and an admin listener with Prometheus metrics, pprof and
// health checks.
//
// # Tour
//
// [config.Config] is the YAML configuration ([config.LoadConfig],
// [config.ParseConfig], [config.DefaultConfig]); [config.Config.Validate]
// names the field at fault. Package config (internal/server/config) knows
// nothing of the runtime. [New] builds a [Server] from it: one [engine.Backend] per policy (a limit and a window), and an
// [engine.GroupBackend] that decides any subset of the policies at once,
// all or nothing; in memory (engine limiters on one clock, grouped with
// [engine.NewGroupOf]) unless a store factory for Config.Store was
// registered with [WithStore] (the Redis backend), which returns them as a
// [Store]. [Server.Start] listens, [Server.Shutdown] drains in-flight
// requests and closes the backends, [Server.Run] does both around a
// context, with a drain delay first (/readyz answers 503 while requests
// are still served; [Server.Hurry] cuts it short). [Server.Reload] and
// [Server.ReloadFrom] replace the policies while serving, keeping the
// state of those that did not change. [Check] runs New's checks without
// building anything and returns the configuration New would run.
//
// Every input a client controls is bounded: connections per listener
// (max_conns), header bytes (max_header_bytes), body bytes and batch
// items, limits per request ([config.MaxLimits]), key length
// ([httplimit.MaxKeyLen]) and bytes (valid UTF-8), keys tracked per policy
// (max_keys), and every wait (read, write, idle and upstream timeouts). docs/operations.md lists each bound with its
// default. Answers with a 5xx status carry a generic message; the detail
// goes to the log, with store passwords redacted.
//
// The decision API:
//
//	POST /v1/allow        {"key": "alice", "policy": "free", "cost": 1}
//	POST /v1/allow        {"limits": [{"policy": "per_second", "key": "alice"},
//	                                  {"policy": "per_hour", "key": "alice"}]}
//	POST /v1/allow/batch  [{"key": "alice"}, {"key": "bob", "cost": 2}]
//
// answers 200 (allowed) or 429 (refused) with [AllowResponse] ([GroupResponse]
// for a request of several limits, decided all or nothing) as JSON and the
// headers of package httplimit; bad input is 400 (413 for oversize bodies
// and batches, 415 for a body that is not application/json) with a
// problem+json body naming the field, never 500. With Config.Upstream
// set, every request is decided by the httplimit middleware and the allowed
// ones are proxied (gateway mode); Config.Routes map a method and path
// prefix to the list of limits its requests count against, all at once.
// Without an upstream, [CheckPath] (/v1/check) decides, the gateway's way,
// the original request a proxy asks about (nginx's auth_request, Caddy's
// forward_auth, Traefik's ForwardAuth, Envoy's ext_authz;
// docs/integrations.md).
//
// Metrics live in the server's own registry (Registry), never the global
// one: decisions by policy and outcome, decision latency, the engine's
// Stats (keys, stored instants, bytes, swept keys, key-cap overflows;
// counters kept on the write path, read at scrape time), bad requests,
// reloads, build information, Go runtime and process metrics.
//
// For tests and deterministic replays, WithClock injects a clock into the
// in-memory backends. To see every decision (for offline verification, as
// the load test does), register a store factory (WithStore) whose backends
// and group record what they decide: every decision goes through one of
// them.
//
// # Concurrency
//
// A Server's methods are safe for concurrent use. Every background
// goroutine (listeners, engine sweepers) stops in Shutdown or Close.
//
// # Example
//
//	cfg := config.DefaultConfig()
//	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
//	srv, err := server.New(cfg)
//	if err != nil {
//		log.Fatal(err)
//	}
//	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
//	defer stop()
//	if err := srv.Run(ctx); err != nil {
//		log.Fatal(err)
//	}
package server
