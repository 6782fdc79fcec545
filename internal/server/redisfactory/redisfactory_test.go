package redisfactory_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/redisfactory"
)

// The factory makes one limiter per policy on a real Redis, in order, with
// a group over them and the store's metrics on the registry; a key of
// store_options it does not know is an error naming it.
func TestFactory(t *testing.T) {
	addr := os.Getenv("SLIDEGATE_REDIS_ADDR")
	if addr == "" {
		t.Skip("SLIDEGATE_REDIS_ADDR not set: run make test (scripts/redis-env.sh starts Redis)")
	}
	// Windows long enough that a loaded machine's slow calls cannot let
	// an entry expire between the three decisions, and no fallback to a
	// fresh local limiter on a slow call (timeout, failure_policy): the
	// test reads Redis's decisions.
	policies := []engine.Policy{
		{Name: "second", Limit: 2, Window: time.Hour},
		{Name: "minute", Limit: 5, Window: time.Minute},
	}
	reg := prometheus.NewRegistry()
	prefix := fmt.Sprintf("sg-factory-%d:", time.Now().UnixNano())
	st, err := redisfactory.New()(context.Background(), server.StoreSpec{
		URL: "redis://" + addr, Options: map[string]any{"key_prefix": prefix, "timeout": "30s", "failure_policy": "closed"}, Policies: policies, Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if len(st.Backends) != 2 || st.Backends[0].Policy().Name != "second" || st.Backends[1].Policy().Name != "minute" || st.Group == nil {
		t.Fatalf("store: %d backends, group %v", len(st.Backends), st.Group)
	}
	for i, want := range []bool{true, true, false} {
		d, err := st.Backends[0].Decide(context.Background(), "k", 1)
		if err != nil || d.Allowed != want {
			t.Fatalf("decision %d: %+v %v, want allowed=%v", i, d, err, want)
		}
	}
	mfs, err := reg.Gather()
	if err != nil || len(mfs) == 0 {
		t.Errorf("no store metrics on the registry: %d families, %v", len(mfs), err)
	}
	_, err = redisfactory.New()(context.Background(), server.StoreSpec{
		URL: "redis://" + addr, Options: map[string]any{"bogus": 1}, Policies: policies,
	})
	if err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("unknown store option: %v", err)
	}
}
