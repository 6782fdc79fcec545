package loadtest

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/lab/internal/keydist"
)

func TestParseFlagsDefaults(t *testing.T) {
	c, err := parseFlags(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Clients != 1_000_000 || c.Dist != keydist.Zipf || c.ZipfS != 1.1 || strings.Join(c.Modes, ",") != "memory,engine,http,capacity" || !c.Verify || c.Strict {
		t.Errorf("defaults %+v", c)
	}
	c, err = parseFlags([]string{"--mode", "engine,http,engine", "--tiers", "a, b", "--http-rate", "10", "--strict"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Modes, ",") != "engine,http" || strings.Join(c.Tiers, ",") != "a,b" || c.Rate != 10 || !c.Strict {
		t.Errorf("parsed %+v", c)
	}
	if p := c.policy(1); p.Name != "b" || p.Limit != 10*c.Limit {
		t.Errorf("tier 1 policy %+v", p)
	}
}

// TestBadFlags: each bad flag stops Main with one line on stderr and a
// non-zero status, before any load.
func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--http-rate", "0"}, "--http-rate 0"},
		{[]string{"--http-rate", "-5"}, "--http-rate -5"},
		{[]string{"--rate", "10"}, "rate"}, // renamed: the flag says its phase
		{[]string{"--clients", "0"}, "--clients 0"},
		{[]string{"--engine-parts", "0"}, "--engine-parts 0"},
		{[]string{"--capacity-budget", "-1s"}, "--capacity-budget -1s"},
		{[]string{"--mode", "turbo"}, `unknown mode "turbo"`},
		{[]string{"--dist", "pareto"}, "--dist"},
		{[]string{"--zipf-s", "1"}, "--zipf-s"},
		{[]string{"--limit", "0"}, "--limit 0"},
		{[]string{"--window", "0s"}, "--window"},
		{[]string{"--engine-requests", "0"}, "--engine-requests 0"},
		{[]string{"--engine-requests", "100", "--max-records", "10"}, "--max-records 10"},
		{[]string{"--engine-duration", "0s"}, "--engine-duration"},
		{[]string{"--duration", "1s"}, "duration"},
		{[]string{"--http-duration", "0s"}, "--http-duration"},
		{[]string{"--target", "ftp://x"}, "--target"},
		{[]string{"--tiers", "a,a"}, "--tiers"},
		{[]string{"--engine-sample", "0"}, "--engine-sample 0"},
		{[]string{"--memory-per-client", "101"}, "--memory-per-client 101"},
		{[]string{"--capacity-workers", "0"}, "--capacity-workers 0"},
		{[]string{"--capacity-workers", "65"}, "--capacity-workers 65"},
		{[]string{"--capacity-max", "0"}, "--capacity-max 0"},
		{[]string{"--capacity-cost-burst", "-1"}, "--capacity-cost-burst -1"},
		{[]string{"--capacity-slice", "1ms"}, "--capacity-slice"},
		{[]string{"--capacity-p99", "0s"}, "--capacity-p99"},
		{[]string{"--capacity-rounds", "0"}, "--capacity-rounds 0"},
		{[]string{"--capacity-rounds", "51"}, "--capacity-rounds 51"},
		{[]string{"--capacity-slice", "1m", "--capacity-rounds", "15"}, "--max-records"},
		{[]string{"--mode", "scale", "--scale-max", "10"}, "--scale-max 10"},
		{[]string{"--mode", "scale", "--scale-decisions", "0"}, "--scale-decisions 0"},
		{[]string{"--mode", "scale", "--scale-max", "10000000", "--limit", "1000"}, "--scale-max 10000000 × --limit 1000"},
		{[]string{"--mode", "redis", "--redis-addr", "", "--redis-cluster", ""}, "--redis-addr and --redis-cluster"},
		{[]string{"--mode", "redis", "--redis-addr", "10.0.0.1:6379"}, "loopback only"},
		{[]string{"--mode", "redis", "--redis-addr", "127.0.0.1:6379", "--redis-callers", "0"}, "--redis-callers 0"},
		{[]string{"--mode", "redis", "--redis-addr", "127.0.0.1:6379", "--redis-engine-duration", "0s"}, "--redis-engine-duration"},
		{[]string{"--mode", "redis", "--redis-addr", "127.0.0.1:6379", "--redis-http-rate", "0"}, "--redis-http-rate 0"},
		{[]string{"--bogus"}, "bogus"},
		{[]string{"extra"}, "extra"},
	} {
		var out, errb bytes.Buffer
		code := Main(context.Background(), tc.args, &out, &errb)
		msg := errb.String()
		if code == 0 || !strings.Contains(msg, tc.want) || strings.Count(msg, "\n") != 1 || out.Len() != 0 {
			t.Errorf("%v: exit %d, stderr %q, stdout %q; want one line with %q", tc.args, code, msg, out.String(), tc.want)
		}
	}
}

func TestUnreachableTarget(t *testing.T) {
	var out, errb bytes.Buffer
	dir := t.TempDir()
	code := Main(context.Background(), []string{"--mode", "http", "--target", "http://127.0.0.1:1", "--out", dir}, &out, &errb)
	if code == 0 || !strings.Contains(errb.String(), "unreachable") || strings.Count(errb.String(), "\n") != 1 {
		t.Errorf("exit %d, stderr %q", code, errb.String())
	}
}

func TestHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main(context.Background(), []string{"-h"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "-clients") {
		t.Errorf("exit %d, usage %q", code, out.String())
	}
}

// TestCapacityPlan: the capacity rounds are looked at twice within the
// budget, once without one, and their count is bounded either way (the
// check of --max-records counts on it, and the defaults pass it).
func TestCapacityPlan(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
	p := c.capacityPlan()
	if p.First != c.CapacityRounds || p.Last != capacityGrowth*c.CapacityRounds || p.Budget != c.CapacityBudget || p.looks() != 2 {
		t.Errorf("plan %+v", p)
	}
	if n := c.capacityMaxRounds(); n < 2*p.First || n > 2*p.Last {
		t.Errorf("at most %d rounds, want from %d to %d", n, 2*p.First, 2*p.Last)
	}
	c.CapacityBudget = 0
	if p := c.capacityPlan(); p.looks() != 1 || c.capacityMaxRounds() != 2*c.CapacityRounds {
		t.Errorf("no budget: plan %+v, %d rounds at most", p, c.capacityMaxRounds())
	}
	c.CapacityBudget = -time.Second
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--capacity-budget") {
		t.Errorf("a negative budget: %v", err)
	}
}
