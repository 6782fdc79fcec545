package loadtest

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestParseFlagsDefaults(t *testing.T) {
	c, err := ParseFlags(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Clients != 1_000_000 || c.Dist != Zipf || c.ZipfS != 1.1 || len(c.Modes) != 3 || !c.Verify {
		t.Errorf("defaults %+v", c)
	}
	c, err = ParseFlags([]string{"--mode", "engine,http", "--tiers", "a, b", "--rate", "10"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Modes, ",") != "engine,http" || strings.Join(c.Tiers, ",") != "a,b" || c.Rate != 10 {
		t.Errorf("parsed %+v", c)
	}
	if p := c.Policy(1); p.Name != "b" || p.Limit != 10*c.Limit {
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
		{[]string{"--rate", "0"}, "--rate 0"},
		{[]string{"--rate", "-5"}, "--rate -5"},
		{[]string{"--clients", "0"}, "--clients 0"},
		{[]string{"--mode", "turbo"}, `unknown mode "turbo"`},
		{[]string{"--dist", "pareto"}, "--dist"},
		{[]string{"--zipf-s", "1"}, "--zipf-s"},
		{[]string{"--limit", "0"}, "--limit 0"},
		{[]string{"--window", "0s"}, "--window"},
		{[]string{"--requests", "0"}, "--requests 0"},
		{[]string{"--requests", "100", "--max-records", "10"}, "--max-records 10"},
		{[]string{"--http-duration", "0s"}, "--http-duration"},
		{[]string{"--target", "ftp://x"}, "--target"},
		{[]string{"--tiers", "a,a"}, "--tiers"},
		{[]string{"--sample", "0"}, "--sample 0"},
		{[]string{"--per-client", "101"}, "--per-client 101"},
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
