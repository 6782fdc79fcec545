package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runSlidegate runs slidegate (this test binary as TestHelperProcess, whose
// main entry is dispatch, as the real binary's) with args, and returns its
// exit status and output. The bound is generous: these runs exit at once,
// and one that serves instead fails the test rather than hanging it.
func runSlidegate(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"-test.run=^TestHelperProcess$", "--"}, args...)...)
	cmd.Env = append(append(os.Environ(), "SLIDEGATE_HELPER=1"), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ctx.Err() == nil:
		code = ee.ExitCode()
	default:
		t.Fatalf("slidegate %q: %v\n%s", args, err, errOut.String())
	}
	return code, out.String(), errOut.String()
}

// lines splits s into its lines, without the last newline.
func lines(s string) []string { return strings.Split(strings.TrimSuffix(s, "\n"), "\n") }

// A mistyped flag gets one line of error, naming the flag and the one it
// is close to, and one line pointing at --help; not the whole usage.
func TestCLIMistypedFlag(t *testing.T) {
	for args, want := range map[string]string{
		"serve --lisen 127.0.0.1:0":      "slidegate serve: flag provided but not defined: --lisen; did you mean --listen?",
		"serve -lisen 127.0.0.1:0":       "slidegate serve: flag provided but not defined: --lisen; did you mean --listen?",
		"serve --print-confg":            "slidegate serve: flag provided but not defined: --print-confg; did you mean --print-config?",
		"serve --frobnicate":             "slidegate serve: flag provided but not defined: --frobnicate",
		"serve --listen":                 "slidegate serve: flag needs an argument: -listen",
		"serve --grpc-max-connections x": `slidegate serve: --grpc-max-connections "x": parse error`,
	} {
		code, out, errOut := runSlidegate(t, nil, strings.Fields(args)...)
		l := lines(errOut)
		if code != 2 || out != "" || len(l) != 2 || l[0] != want || l[1] != "Run 'slidegate serve --help' for the flags." {
			t.Errorf("slidegate %s: exit %d, stdout %q, stderr:\n%s\nwant exit 2 and two lines, the first %q", args, code, out, errOut, want)
		}
		if strings.Contains(want, "frobnicate") && strings.Contains(errOut, "did you mean") {
			t.Errorf("slidegate %s: a suggestion for a flag nothing like it: %s", args, errOut)
		}
	}
	// Help, asked for, is the whole usage, on stdout, exit 0.
	code, out, errOut := runSlidegate(t, nil, "serve", "--help")
	if code != 0 || errOut != "" || !strings.Contains(out, "Usage: slidegate serve") || !strings.Contains(out, "-drain-delay duration") {
		t.Errorf("serve --help: exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
}

// A mistyped command gets a suggestion of the command it is close to.
func TestCLIMistypedCommand(t *testing.T) {
	for args, want := range map[string]string{
		"serv":       `slidegate: unknown command "serv"; did you mean "serve"?`,
		"sreve":      `slidegate: unknown command "sreve"; did you mean "serve"?`,
		"versoin":    `slidegate: unknown command "versoin"; did you mean "version"?`,
		"help serv":  `slidegate: unknown command "serv"; did you mean "serve"?`,
		"frobnicate": `slidegate: unknown command "frobnicate"`,
	} {
		code, out, errOut := runSlidegate(t, nil, strings.Fields(args)...)
		l := lines(errOut)
		if code != 2 || out != "" || len(l) != 2 || l[0] != want || l[1] != "Run 'slidegate help' for the commands." {
			t.Errorf("slidegate %s: exit %d, stdout %q, stderr:\n%s\nwant exit 2 and two lines, the first %q", args, code, out, errOut, want)
		}
	}
}

// A duration flag without a unit says that the unit is missing, as the
// configuration file does.
func TestCLIDurationUnit(t *testing.T) {
	for _, flag := range []string{"--drain-delay", "--shutdown-timeout"} {
		code, _, errOut := runSlidegate(t, nil, "serve", flag, "5")
		want := "slidegate serve: " + flag + `: "5" is not a duration with a unit, such as 60s, 1m30s or 24h`
		if l := lines(errOut); code != 2 || len(l) != 2 || l[0] != want {
			t.Errorf("serve %s 5: exit %d, stderr:\n%s\nwant %q", flag, code, errOut, want)
		}
	}
	code, _, errOut := runSlidegate(t, nil, "health", "--timeout", "5")
	if l := lines(errOut); code != 2 || len(l) != 2 || !strings.Contains(l[0], `--timeout: "5" is not a duration with a unit`) ||
		l[1] != "Run 'slidegate health --help' for the flags." {
		t.Errorf("health --timeout 5: exit %d, stderr:\n%s", code, errOut)
	}
	code, out, errOut := runSlidegate(t, nil, "serve", "--print-config", "--drain-delay", "1m30s", "--shutdown-timeout", "0")
	if code != 0 || !strings.Contains(out, "drain_delay: 1m30s") || !strings.Contains(out, "shutdown_timeout: 10s") {
		t.Errorf("durations with units (and 0): exit %d\n%s%s", code, out, errOut)
	}
}

// --store and --store-file both give the store URL: an error, as store and
// store_file together are in the configuration file.
func TestCLIStoreAndStoreFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "url")
	if err := os.WriteFile(path, []byte("redis://127.0.0.1:1/0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, extra := range [][]string{nil, {"--print-config"}} {
		args := append([]string{"serve", "--store", "redis://127.0.0.1:2/0", "--store-file", path}, extra...)
		code, out, errOut := runSlidegate(t, nil, args...)
		if code != 2 || out != "" || !strings.Contains(errOut, "--store and --store-file both give the store URL") {
			t.Errorf("slidegate %q: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfg, []byte("store: redis://127.0.0.1:2/0\nstore_file: "+path+"\npolicies:\n  - {name: free, limit: 5, window: 60s}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runSlidegate(t, nil, "serve", "--print-config", "--config", cfg); code != 1 || !strings.Contains(errOut, "store_file: set together with store") {
		t.Errorf("store and store_file in the file: exit %d, %s", code, errOut)
	}
}

// --print-config prints what serve runs (the store URL read from
// --store-file, redacted) and refuses, with serve's exit status and error,
// what serve refuses before it serves: Envoy rules it cannot read, TLS
// files it cannot load, a store scheme this build lacks.
func TestCLIPrintConfigIsServe(t *testing.T) {
	dir := t.TempDir()
	url := filepath.Join(dir, "url")
	if err := os.WriteFile(url, []byte("redis://:file-s3cret@127.0.0.1:6379/0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runSlidegate(t, nil, "serve", "--print-config", "--store-file", url)
	if code != 0 || !strings.Contains(out, "store: redis://:xxxxx@127.0.0.1:6379/0") || !strings.Contains(out, "\nstore_file: \"\"\n") ||
		strings.Contains(out+errOut, "s3cret") {
		t.Errorf("--store-file: exit %d\n%s%s", code, out, errOut)
	}

	badRules := filepath.Join(dir, "ratelimit.yaml")
	if err := os.WriteFile(badRules, []byte("domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"serve", "--listen", "127.0.0.1:0", "--admin", "off", "--drain-delay", "0s"}
	for name, args := range map[string][]string{
		"envoy rules":  {"--grpc", "127.0.0.1:0", "--envoy-config", badRules},
		"envoy file":   {"--grpc", "127.0.0.1:0", "--envoy-config", filepath.Join(dir, "missing.yaml")},
		"tls files":    {"--tls-cert", filepath.Join(dir, "missing.pem"), "--tls-key", filepath.Join(dir, "missing.key")},
		"store scheme": {"--store", "memcached://127.0.0.1:1"},
	} {
		sc, _, serr := runSlidegate(t, nil, append(append([]string(nil), base...), args...)...)
		pc, pout, perr := runSlidegate(t, nil, append(append(append([]string(nil), base...), args...), "--print-config")...)
		last := func(s string) string { l := lines(s); return l[len(l)-1] }
		if sc == 0 || pc != sc || last(perr) != last(serr) || pout != "" || !strings.HasPrefix(last(serr), "slidegate serve: ") {
			t.Errorf("%s: serve exit %d %q; --print-config exit %d %q, stdout %q", name, sc, last(serr), pc, last(perr), pout)
		}
	}
}
