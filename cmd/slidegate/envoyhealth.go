package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/slidegate/slidegate/internal/redact"
	"github.com/slidegate/slidegate/internal/rls"
	"github.com/slidegate/slidegate/redisstore"
)

// envoyHealth is envoy serve's health, as the peer's health checker
// keeps it: healthy while every component is. The components are the
// configuration (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED) and the Redis
// connection (REDIS_HEALTH_CHECK_ACTIVE_CONNECTION). The answer is gRPC
// health for the service's names and the HTTP /healthcheck.
type envoyHealth struct {
	hs            *health.Server
	mu            sync.Mutex
	config, redis bool
}

func newEnvoyHealth(hs *health.Server) *envoyHealth {
	return &envoyHealth{hs: hs, config: true, redis: true}
}

// setConfig records whether the configuration component is healthy.
func (h *envoyHealth) setConfig(ok bool) { h.set(&h.config, ok) }

// setRedis records whether the Redis component is healthy.
func (h *envoyHealth) setRedis(ok bool) { h.set(&h.redis, ok) }

func (h *envoyHealth) set(c *bool, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	*c = ok
	st := healthpb.HealthCheckResponse_SERVING
	if !h.config || !h.redis {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	h.hs.SetServingStatus(rls.ServiceName, st)
	h.hs.SetServingStatus(rls.PeerHealthName, st)
}

// ok reports whether every component is healthy.
func (h *envoyHealth) ok() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.config && h.redis
}

// redisHealthInterval is how often the Redis component is checked.
const redisHealthInterval = time.Second

// watchRedis follows the Redis component, as the peer's
// REDIS_HEALTH_CHECK_ACTIVE_CONNECTION does: unhealthy while no
// connection to Redis can be held, healthy again once one can. Its own
// connection to the store's Redis sends PING every second. It fails when
// Redis cannot be reached at start, as the peer does. The returned stop
// ends the goroutine and closes the connection.
func (h *envoyHealth) watchRedis(ctx context.Context, s *envoySettings, logger *slog.Logger) (stop func(), err error) {
	o, err := redisstore.OptionsFromMap(s.storeOptions)
	if err != nil {
		return nil, err
	}
	st, err := redisstore.Open(s.store, append(o, redisstore.WithLogger(logger))...)
	if err != nil {
		return nil, fmt.Errorf("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION: %s", redact.URLs(err.Error()))
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(redisHealthInterval)
		defer t.Stop()
		up := true
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			pctx, pcancel := context.WithTimeout(ctx, redisHealthInterval)
			err := st.Ping(pctx)
			pcancel()
			if ctx.Err() != nil {
				return
			}
			if now := err == nil; now != up {
				up = now
				h.setRedis(up)
				if up {
					logger.Warn("redis reachable again: healthy")
				} else {
					logger.Error("redis unreachable: unhealthy (REDIS_HEALTH_CHECK_ACTIVE_CONNECTION)", "err", redact.URLs(err.Error()))
				}
			}
		}
	}()
	return func() {
		cancel()
		<-done
		_ = st.Close()
	}, nil
}
