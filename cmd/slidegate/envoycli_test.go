package main

import (
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/rls"
)

// slidegate envoy serve and check answer a mistyped flag as serve does:
// one line of error, naming the flag and the one it is close to, and one
// line pointing at --help; not the whole usage.
func TestCLIEnvoyMistypedFlag(t *testing.T) {
	dir := t.TempDir()
	for args, want := range map[string]string{
		"envoy serve --max-key 5":                   "slidegate envoy serve: flag provided but not defined: --max-key; did you mean --max-keys?",
		"envoy serve -grpc-prot 1":                  "slidegate envoy serve: flag provided but not defined: --grpc-prot; did you mean --grpc-port?",
		"envoy check --confg " + dir:                "slidegate envoy check: flag provided but not defined: --confg; did you mean --config?",
		"envoy serve --frobnicate":                  "slidegate envoy serve: flag provided but not defined: --frobnicate",
		"envoy serve --config":                      "slidegate envoy serve: flag needs an argument: -config",
		"envoy serve --grpc-max-connections x":      `slidegate envoy serve: --grpc-max-connections "x": parse error`,
		"envoy serve --watch-interval 5":            `slidegate envoy serve: --watch-interval: "5" is not a duration with a unit, such as 60s, 1m30s or 24h`,
		"envoy serve --grpc-max-connection-idle 10": `slidegate envoy serve: --grpc-max-connection-idle: "10" is not a duration with a unit, such as 60s, 1m30s or 24h`,
		"envoy serve extra":                         `slidegate envoy serve: unexpected argument "extra"`,
		"envoy check a b":                           "slidegate envoy check: one directory, not 2 arguments",
	} {
		code, out, errOut := runSlidegate(t, nil, strings.Fields(args)...)
		cmd := strings.Join(strings.Fields(args)[:2], " ")
		l := lines(errOut)
		if code != 2 || out != "" || len(l) != 2 || l[0] != want || l[1] != "Run 'slidegate "+cmd+" --help' for the flags." {
			t.Errorf("slidegate %s: exit %d, stdout %q, stderr:\n%s\nwant exit 2 and two lines, the first %q", args, code, out, errOut, want)
		}
		if strings.Contains(want, "frobnicate") && strings.Contains(errOut, "did you mean") {
			t.Errorf("slidegate %s: a suggestion for a flag nothing like it: %s", args, errOut)
		}
	}
	// Help, asked for, is the whole usage and the command's flags, on
	// stdout, exit 0.
	for _, args := range [][]string{{"envoy", "serve", "--help"}, {"envoy", "check", "-h"}, {"help", "envoy"}, {"envoy", "--help"}} {
		code, out, errOut := runSlidegate(t, nil, args...)
		if code != 0 || errOut != "" || !strings.Contains(out, "slidegate envoy serve [flags]") {
			t.Errorf("%q: exit %d, stderr %q, stdout:\n%s", args, code, errOut, out)
		}
		if args[len(args)-1] != "envoy" && args[1] != "--help" && !strings.Contains(out, "-grpc-max-connection-idle duration") {
			t.Errorf("%q: no flags in the help:\n%s", args, out)
		}
	}
	// A variable's bad value names the variable, in one line.
	code, _, errOut := runSlidegate(t, []string{"GRPC_MAX_CONNECTION_AGE=5"}, "envoy", "check", filepath.Join(dir, "none"))
	if l := lines(errOut); code != 2 || len(l) != 1 || l[0] != `slidegate envoy check: GRPC_MAX_CONNECTION_AGE: "5" is not a duration with a unit, such as 60s, 1m30s or 24h` {
		t.Errorf("GRPC_MAX_CONNECTION_AGE=5: exit %d, stderr:\n%s", code, errOut)
	}
}

// A mistyped subcommand of slidegate envoy gets a suggestion and a line
// pointing at its help.
func TestCLIEnvoyMistypedCommand(t *testing.T) {
	for args, want := range map[string]string{
		"envoy serv":       `slidegate envoy: unknown command "serv"; did you mean "serve"?`,
		"envoy chekc":      `slidegate envoy: unknown command "chekc"; did you mean "check"?`,
		"envoy frobnicate": `slidegate envoy: unknown command "frobnicate"`,
		"envoy --max-keys": `slidegate envoy: unknown command "--max-keys"`,
	} {
		code, out, errOut := runSlidegate(t, nil, strings.Fields(args)...)
		l := lines(errOut)
		if code != 2 || out != "" || len(l) != 2 || l[0] != want || l[1] != "Run 'slidegate envoy --help' for the commands." {
			t.Errorf("slidegate %s: exit %d, stdout %q, stderr:\n%s\nwant exit 2 and two lines, the first %q", args, code, out, errOut, want)
		}
	}
	// No subcommand at all: the usage, on stderr, exit 2.
	if code, out, errOut := runSlidegate(t, nil, "envoy"); code != 2 || out != "" || !strings.Contains(errOut, "slidegate envoy check [flags] DIR") {
		t.Errorf("slidegate envoy: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// serve's Envoy rules on the memory store are capped at
// config.DefaultMaxKeys keys per rule unless --envoy-max-keys says
// otherwise, and --print-config shows the cap; on Redis there is no cap to
// show, and one given is refused.
func TestServeEnvoyMaxKeysDefault(t *testing.T) {
	rules := filepath.Join(t.TempDir(), "ratelimit.yaml")
	writeFile(t, rules, idleTestRules)
	base := []string{"serve", "--print-config", "--grpc", "127.0.0.1:0", "--envoy-config", rules}
	grpcSection := func(out string) string { _, s, _ := strings.Cut(out, "\ngrpc:\n"); return s }
	for _, c := range []struct {
		extra      []string
		code       int
		want, not  string
		wantStderr string
	}{
		{nil, 0, "max_keys: 1000000", "", ""},
		{[]string{"--envoy-max-keys", "7"}, 0, "max_keys: 7", "", ""},
		{[]string{"--store", "redis://127.0.0.1:1/0"}, 0, "max_connection_idle: 5m0s", "max_keys", ""},
		{[]string{"--store", "redis://127.0.0.1:1/0", "--envoy-max-keys", "1000000"}, 2, "", "", "the Redis store has no key cap"},
		{[]string{"--envoy-max-keys", "0"}, 2, "", "", "--envoy-max-keys 0 must be at least 1"},
		{[]string{"--grpc-max-connection-age", "0s"}, 2, "", "", "--grpc-max-connection-age 0s must be positive"},
	} {
		code, out, errOut := runSlidegate(t, nil, append(append([]string(nil), base...), c.extra...)...)
		g := grpcSection(out)
		if code != c.code || !strings.Contains(g, c.want) || c.not != "" && strings.Contains(g, c.not) || !strings.Contains(errOut, c.wantStderr) {
			t.Errorf("%q: exit %d, grpc section:\n%s\nstderr %q; want exit %d, %q in it, not %q, stderr %q", c.extra, code, g, errOut, c.code, c.want, c.not, c.wantStderr)
		}
	}
}

// slidegate envoy reads the peer's GRPC_MAX_CONNECTION_AGE and
// GRPC_MAX_CONNECTION_AGE_GRACE; a flag given wins, also over a variable
// whose value is not a duration.
func TestEnvoyConnLifetimesFromEnvironment(t *testing.T) {
	for _, c := range []struct {
		env        map[string]string
		args       []string
		age, grace time.Duration
		err        string
	}{
		{nil, nil, rls.DefaultMaxConnectionAge, rls.DefaultMaxConnectionAgeGrace, ""},
		{map[string]string{"GRPC_MAX_CONNECTION_AGE": "48h", "GRPC_MAX_CONNECTION_AGE_GRACE": "90s"}, nil, 48 * time.Hour, 90 * time.Second, ""},
		{map[string]string{"GRPC_MAX_CONNECTION_AGE": "48h"}, []string{"--grpc-max-connection-age", "2h"}, 2 * time.Hour, rls.DefaultMaxConnectionAgeGrace, ""},
		{map[string]string{"GRPC_MAX_CONNECTION_AGE": "soon"}, []string{"--grpc-max-connection-age", "2h"}, 2 * time.Hour, rls.DefaultMaxConnectionAgeGrace, ""},
		{map[string]string{"GRPC_MAX_CONNECTION_AGE": "soon"}, []string{"--grpc-max-connection-age-grace", "2h"}, 0, 0, "GRPC_MAX_CONNECTION_AGE: "},
		{map[string]string{"GRPC_MAX_CONNECTION_AGE_GRACE": "0s"}, nil, 0, 0, "--grpc-max-connection-age-grace 0s must be positive"},
	} {
		fs, s, finish := envoyCmdFlags("serve", func(k string) string { return c.env[k] }, io.Discard)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		err := finish()
		switch {
		case c.err != "":
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v %q: %v, want an error with %q", c.env, c.args, err, c.err)
			}
		case err != nil || time.Duration(s.conns.age) != c.age || time.Duration(s.conns.grace) != c.grace ||
			time.Duration(s.conns.idle) != rls.DefaultMaxConnectionIdle:
			t.Errorf("%v %q: age %v, grace %v, idle %v, %v; want %v, %v", c.env, c.args, s.conns.age, s.conns.grace, s.conns.idle, err, c.age, c.grace)
		}
	}
}

// The grpc section's call bounds reach serve --grpc as their flags do; a
// flag given wins; unset, the defaults are printed.
func TestServeGRPCCallBoundsFromConfig(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "ratelimit.yaml")
	writeFile(t, rules, idleTestRules)
	cfg := filepath.Join(dir, "slidegate.yaml")
	writeFile(t, cfg, "policies:\n  - {name: free, limit: 5, window: 60s}\ngrpc:\n  listen: 127.0.0.1:0\n  envoy_config: "+rules+"\n  max_calls_per_address: 6\n  call_timeout: 3s\n")
	grpcSection := func(out string) string { _, s, _ := strings.Cut(out, "\ngrpc:\n"); return s }
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"serve", "--print-config", "--config", cfg}, []string{"max_calls_per_address: 6\n", "call_timeout: 3s\n"}},
		{[]string{"serve", "--print-config", "--config", cfg, "--grpc-max-calls-per-address", "9", "--grpc-call-timeout", "4s"}, []string{"max_calls_per_address: 9\n", "call_timeout: 4s\n"}},
		{[]string{"serve", "--print-config", "--grpc", "127.0.0.1:0", "--envoy-config", rules}, []string{"max_calls_per_address: 2048\n", "call_timeout: 10s\n"}},
	} {
		code, out, errOut := runSlidegate(t, nil, c.args...)
		g := grpcSection(out)
		for _, w := range c.want {
			if code != 0 || !strings.Contains(g, w) {
				t.Errorf("%q: exit %d, want %q in the grpc section:\n%s\nstderr %q", c.args, code, w, g, errOut)
			}
		}
	}
}
