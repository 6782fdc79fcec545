package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
)

// storeLimiter is a limiter with the store it came from, closed together.
type storeLimiter struct {
	*Limiter
	st *Store
}

func (l storeLimiter) Close() error { return l.st.Close() }

// TestRueidisClient: a store on the caller's own rueidis client (a
// standalone one and a cluster one) runs the backend suite, falls back to
// EVAL after SCRIPT FLUSH, and leaves the client open on Close.
func TestRueidisClient(t *testing.T) {
	for _, c := range []struct {
		name  string
		addrs func(testing.TB) []string
	}{
		{"Standalone", func(t testing.TB) []string { return []string{standaloneAddr(t)} }},
		{"Cluster", clusterAddrs},
	} {
		t.Run(c.name, func(t *testing.T) {
			rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: c.addrs(t), DisableCache: true, AlwaysPipelining: true})
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			client := RueidisClient(rc)
			backendtest.Run(t, func(t *testing.T, p engine.Policy, clk engine.Clock) engine.Backend {
				st, err := OpenClient("rueidis", client, suiteOptions(t, clk)...)
				if err != nil {
					t.Fatal(err)
				}
				l, err := st.Limiter(p)
				if err != nil {
					st.Close()
					t.Fatal(err)
				}
				return storeLimiter{l, st}
			}, tlsSizes, engine.SlidingLog, engine.SlidingCounter)

			st, err := OpenClient("rueidis", client, WithKeyPrefix(testPrefix(t)), WithFailurePolicy(FailClosed), WithTimeout(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if st.cluster != (c.name == "Cluster") {
				t.Errorf("cluster %v", st.cluster)
			}
			st.Close()
		})
	}
	// SCRIPT FLUSH on a server of the test's own (the shared ones serve
	// other packages' raw EVALSHAs meanwhile).
	t.Run("NoScript", func(t *testing.T) {
		srv := ownRedis(t)
		rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.addr}, DisableCache: true, AlwaysPipelining: true})
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		st, err := OpenClient("rueidis", RueidisClient(rc), WithKeyPrefix(testPrefix(t)), WithFailurePolicy(FailClosed), WithTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		l, err := st.Limiter(engine.Policy{Name: "byo", Limit: 2, Window: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if _, err := l.Decide(ctx, "k", 1); err != nil {
			t.Fatal(err)
		}
		if err := rc.Do(ctx, rc.B().ScriptFlush().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if d, err := l.Decide(ctx, "k", 1); err != nil || !d.Allowed || d.Remaining != 0 {
			t.Errorf("after SCRIPT FLUSH: %+v %v", d, err)
		}
		st.Close()
		if err := rc.Do(ctx, rc.B().Ping().Build()).Error(); err != nil {
			t.Errorf("the caller's client after Store.Close: %v", err)
		}
		if _, err := l.Decide(ctx, "k", 1); !errors.Is(err, ErrClosed) {
			t.Errorf("Decide after Close: %v", err)
		}
	})
	if _, err := OpenClient("nil", nil); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("nil client: %v", err)
	}
}
