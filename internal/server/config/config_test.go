package config_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/server/config"
)

func TestDefaultConfig(t *testing.T) {
	c := config.DefaultConfig()
	if c.Listen != "127.0.0.1:8080" || c.Admin != "127.0.0.1:9090" || c.DefaultPolicy != "free" || c.Key != "ip" || c.Store != "memory" {
		t.Fatalf("default config %+v", c)
	}
	if len(c.Policies) != 2 || !reflect.DeepEqual(c.Policies[0], config.PolicyConfig{Name: "free", Limit: 100, Window: config.Duration(time.Minute)}) ||
		!reflect.DeepEqual(c.Policies[1], config.PolicyConfig{Name: "paid", Limit: 1000, Window: config.Duration(time.Minute), Algorithm: "log"}) {
		t.Fatalf("default policies %+v", c.Policies)
	}
	// What --print-config prints parses back to the same configuration.
	out, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	c2, err := config.ParseConfig(out)
	if err != nil {
		t.Fatalf("printed config does not parse: %v\n%s", err, out)
	}
	a, _ := c.Marshal()
	b, _ := c2.Marshal()
	// Parsing fills in max_keys (the memory store's default key cap).
	want := c.Policies[1]
	want.MaxKeys, want.Overflow = config.DefaultMaxKeys, config.OverflowRefuse
	if string(a) != string(b) || !reflect.DeepEqual(c2.Policies[1], want) || c2.MaxBatch != config.DefaultMaxBatch || *c2.Headers.Draft != true {
		t.Fatalf("round trip:\n%s\nvs\n%s", a, b)
	}
}

// TestConfigErrors: every invalid configuration is refused with a message
// that names the field and the problem.
func TestConfigErrors(t *testing.T) {
	const pol = "policies:\n  - {name: free, limit: 5, window: 60s}\n"
	cases := []struct {
		yaml, want string
	}{
		{"listen: 127.0.0.1:8080\n", "policies: at least one policy is required"},
		{"policies:\n  - {name: free, limit: 0, window: 60s}\n", "policies[0] (free).limit: limit 0 must be at least 1"},
		{"policies:\n  - {name: free, limit: -5, window: 60s}\n", "policies[0] (free).limit"},
		{"policies:\n  - {name: free, limit: 5}\n", "policies[0] (free).window: missing or zero"},
		{"policies:\n  - {name: free, limit: 5, window: -1s}\n", "policies[0] (free).window: window -1s must be positive"},
		{"policies:\n  - {name: free, limit: 5, window: 9000h}\n", "policies[0] (free).window"},
		{"policies:\n  - {name: free, limit: 5, window: sixty}\n", "sixty"},
		{"policies:\n  - {name: free, limit: 5, window: 60s, algorithm: bucket}\n", `policies[0] (free).algorithm: "bucket" is not log or counter`},
		{"policies:\n  - {name: free, limit: 5000000, window: 60s}\n", "policies[0] (free).limit: limit 5000000 exceeds"},
		{"policies:\n  - {limit: 5, window: 60s}\n", `policies[0].name: ""`},
		{"policies:\n  - {name: 'a b', limit: 5, window: 60s}\n", `policies[0].name: "a b"`},
		{pol + "  - {name: free, limit: 6, window: 60s}\n", `policies[1] (free).name: duplicate policy name "free"`},
		{"default_policy: gold\n" + pol, `default_policy: "gold" is not the name of a policy`},
		{"listen: nowhere\n" + pol, `listen: "nowhere" is not host:port`},
		{"admin: 127.0.0.1\n" + pol, `admin: "127.0.0.1" is not host:port`},
		{"key: cookie\n" + pol, `key: key "cookie": want ip, header:NAME or const:VALUE`},
		{"key: 'header:'\n" + pol, "key:"},
		{"tier_header: 'X Plan'\n" + pol, `tier_header: "X Plan" is not a header name`},
		{"trusted_proxies: [10.0.0.0/33]\n" + pol, `trusted_proxies: "10.0.0.0/33" is neither a CIDR range nor an IP address`},
		{"ipv6_prefix: 129\n" + pol, "ipv6_prefix: 129 is outside 1..128"},
		{"upstream: ftp://x\n" + pol, `upstream: "ftp://x" is not an http:// or https:// URL`},
		{"store: nowhere\n" + pol, `store: "nowhere" is neither memory nor a URL`},
		{"max_body_bytes: -1\n" + pol, "max_body_bytes: -1 is outside 1..67108864"},
		{"max_batch: -1\n" + pol, "max_batch: -1 is outside 1..10000"},
		{"shutdown_timeout: -1s\n" + pol, "shutdown_timeout: -1s is negative"},
		{"polices: []\n" + pol, "key polices not found (a top-level key"},
		{"policies:\n  - {name: free, limit: 5, window: 60s, burst: 3}\n", "key burst not found in a policy"},
		{"policies: {name: free}\n", "line 1: cannot unmarshal !!map into policies (a list of"},
		{"policies:\n  - {name: free, limit: 5, window: 1 minute}\n", `window: "1 minute" is not a duration with a unit, such as 60s`},
		{"listen: [\n", "config"},
	}
	for _, c := range cases {
		_, err := config.ParseConfig([]byte(c.yaml))
		if err == nil {
			t.Errorf("%q: accepted", c.yaml)
			continue
		}
		if !errors.Is(err, config.ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q:\n  error %q\n  want it to contain %q", c.yaml, err, c.want)
		}
	}
}

// TestConfigMergeKeys: YAML merge keys (<<: *anchor), which the decoder
// resolves, are accepted, and what they merge is still checked.
func TestConfigMergeKeys(t *testing.T) {
	const y = "policies:\n  - &base {name: free, limit: 5, window: 60s}\n  - <<: *base\n    name: paid\n    limit: 50\n" +
		"  - <<: [*base]\n    name: team\n"
	c, err := config.ParseConfig([]byte(y))
	if err != nil {
		t.Fatalf("merge keys refused: %v", err)
	}
	if len(c.Policies) != 3 || c.Policies[1].Name != "paid" || c.Policies[1].Limit != 50 || c.Policies[1].Window != config.Duration(time.Minute) ||
		c.Policies[2].Name != "team" || c.Policies[2].Limit != 5 {
		t.Fatalf("policies %+v", c.Policies)
	}
	_, err = config.ParseConfig([]byte("policies:\n  - <<: {name: free, limit: 5, window: 60s, burst: 3}\n"))
	if err == nil || !strings.Contains(err.Error(), "key burst not found in a policy") {
		t.Fatalf("an unknown key inside a merged mapping: %v", err)
	}
}

// TestConfigAliasShape: an alias (*name) is checked against the type of
// the place it is used, so that one used where it does not fit is
// reported in the configuration's words, like any other node.
func TestConfigAliasShape(t *testing.T) {
	const pol = "policies:\n  - &p {name: free, limit: 5, window: 60s}\n"
	for y, want := range map[string]string{
		pol + "headers: *p\n":              "key name not found in headers (want draft, x, retry_after)",
		pol + "trusted_proxies: *p\n":      "cannot unmarshal !!map into trusted_proxies (a list of strings)",
		pol + "  - <<: *p\n    burst: 3\n": "key burst not found in a policy",
		"policies: &l\n  - {name: free, limit: 5, window: 60s}\nrouting: *l\n": "key routing not found",
	} {
		_, err := config.ParseConfig([]byte(y))
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "config.") {
			t.Errorf("%q:\n  error %v\n  want it to contain %q", y, err, want)
		}
	}
	c, err := config.ParseConfig([]byte(pol + "  - {name: paid, limit: 50, window: 60s}\nroutes:\n  - {path: /a, limits: &ls [{policy: free}]}\n  - {path: /b, limits: *ls}\nupstream: http://127.0.0.1:1\n"))
	if err != nil || len(c.Routes) != 2 || len(c.Routes[1].Limits) != 1 {
		t.Fatalf("a fitting alias: %v %+v", err, c.Routes)
	}
}

// TestLoadConfig: LoadConfig's errors name the file and the field.
func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sg.yaml")
	if err := os.WriteFile(path, []byte("policies:\n  - {name: free, limit: 0, window: 60s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := config.LoadConfig(path); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "policies[0] (free).limit") {
		t.Errorf("LoadConfig error %v should name the file and the field", err)
	}
	if _, err := config.LoadConfig(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("missing file accepted")
	}
}

// FuzzParseConfig: any input is either a valid configuration or an error
// wrapping ErrConfig; never a panic.
func FuzzParseConfig(f *testing.F) {
	f.Add(string(config.DefaultYAML()))
	f.Add("policies:\n  - {name: a, limit: 1, window: 1ns}\n")
	f.Add("headers: {draft: false}\npolicies: [{name: b, limit: 3, window: 1h, algorithm: counter}]\n")
	f.Add("policies: [{name: a, limit: 2, window: 1s}, {name: b, limit: 9, window: 1h}]\nroutes:\n  - {method: POST, path: /api/, limits: [{policy: a, key: ip}, {policy: b, key: 'const:x+route'}], tiers: {p: [{policy: b}]}}\n")
	f.Fuzz(func(t *testing.T, in string) {
		c, err := config.ParseConfig([]byte(in))
		if err != nil {
			if !errors.Is(err, config.ErrConfig) {
				t.Fatalf("error %v does not wrap ErrConfig", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("parsed config does not validate: %v", err)
		}
	})
}

// TestConfigFieldTypes: each field type reads its own YAML scalar: sizes
// with a binary unit, whole numbers only, a unit on every duration, true
// or false only, an upstream that parses; errors name the line and key.
func TestConfigFieldTypes(t *testing.T) {
	const pol = "policies:\n  - {name: free, limit: 5, window: 60s}\n"
	c, err := config.ParseConfig([]byte("max_body_bytes: 64KiB\nmax_header_bytes: 2048\ndrain_delay: 1m30s\n" + pol))
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxBodyBytes != 64<<10 || c.MaxHeaderBytes != 2048 || *c.DrainDelay != config.Duration(90*time.Second) {
		t.Errorf("sizes and durations: %d %d %v", c.MaxBodyBytes, c.MaxHeaderBytes, *c.DrainDelay)
	}
	if c.DefaultPolicy != "free" || c.Listen != config.DefaultListen {
		t.Errorf("ParseConfig fills in the defaults: default_policy %q, listen %q", c.DefaultPolicy, c.Listen)
	}
	for y, want := range map[string]string{
		"max_body_bytes: 1.5KiB\n" + pol: `line 1: max_body_bytes: "1.5KiB" is not a size in bytes`,
		"max_body_bytes: 64kb\n" + pol:   `line 1: max_body_bytes: "64kb" is not a size in bytes`,
		"drain_delay: 5\n" + pol:         `line 1: drain_delay: "5" is not a duration with a unit`,
		"shutdown_timeout: 10\n" + pol:   `line 1: shutdown_timeout: "10" is not a duration with a unit`,
		"max_conns: 10.0\n" + pol:        `line 1: max_conns: "10.0" is not a whole number`,
		"shadow: on\n" + pol:             `line 1: shadow: "on" is not true or false`,
		"upstream: localhost:80\n" + pol: `line 1: upstream: "localhost:80" is not an http:// or https:// URL with a host`,
		"default_policy: gold\n" + pol:   `default_policy: "gold" is not the name of a policy`,
	} {
		_, err := config.ParseConfig([]byte(y))
		if err == nil || !errors.Is(err, config.ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q:\n  error %v\n  want it to contain %q", y, err, want)
		}
	}
	if _, err := config.ParseDuration("5"); err == nil || !strings.Contains(err.Error(), "unit") {
		t.Errorf("ParseDuration(5): %v, want an error naming the unit", err)
	}
}

// TestConfigErrorClasses: each kind of misfit node is refused by the type
// it is read into, with the line, the key (or what the node is) and what
// belongs there, in the configuration's words.
func TestConfigErrorClasses(t *testing.T) {
	const pol = "policies:\n  - &p {name: free, limit: 5, window: &w 60s}\n"
	const policyKeys = "name, limit, window, algorithm, max_keys, overflow, overrides"
	for _, c := range []struct{ yaml, want string }{
		// A key the mapping does not have, at the top and nested.
		{"polices: []\n" + pol, "line 1: key polices not found (a top-level key; see slidegate serve --print-config)"},
		{pol + "tls: {cert: x}\n", "line 3: key cert not found in tls (want cert_file, key_file, client_ca_file)"},
		{pol + "upstream: http://127.0.0.1:1\nroutes:\n  - {path: /a, limits: [{policy: free}], tiers: {pro: [{policy: free, keys: ip}]}}\n",
			"line 5: key keys not found in a limit (want policy, key)"},
		// A list where a mapping belongs.
		{pol + "grpc: [a]\n", "line 3: cannot unmarshal !!seq into grpc (a mapping {listen, envoy_config, envoy_headers, max_connections, max_keys, max_connection_idle, max_connection_age, max_connection_age_grace, cluster_tag, max_calls_per_address, call_timeout})"},
		{"policies:\n  - [free, 5, 60s]\n", "line 2: cannot unmarshal !!seq into a policy (a mapping {" + policyKeys + "})"},
		{"- listen\n", "line 1: cannot unmarshal !!seq into the configuration (a mapping of keys)"},
		// A scalar where a list belongs, and a list inside one.
		{"trusted_proxies: 10.0.0.0/8\n" + pol, "line 1: cannot unmarshal !!str `10.0.0.0/8` into trusted_proxies (a list of strings)"},
		{"policies: free\n", "line 1: cannot unmarshal !!str `free` into policies (a list of {" + policyKeys + "})"},
		{"trusted_proxies: [10.0.0.0/8, [a]]\n" + pol, "line 1: cannot unmarshal !!seq into trusted_proxies[1] (a string)"},
		{pol + "routes:\n  - {path: /a, limits: [{policy: free}], tiers: {pro: {policy: free}}}\n", "line 4: cannot unmarshal !!map into tiers.pro (a list of {policy, key})"},
		// A duration without a unit, or not a scalar at all.
		{"policies:\n  - {name: free, limit: 5, window: 60}\n", `line 2: window: "60" is not a duration with a unit, such as 60s, 1m30s or 24h`},
		{"drain_delay: {s: 5}\n" + pol, "line 1: cannot unmarshal !!map into drain_delay (a duration with a unit, such as 60s, 1m30s or 24h)"},
		// A merge key whose mapping holds an unknown key.
		{pol + "  - <<: [*p, {wind: 1s}]\n    name: paid\n", "line 3: key wind not found in a policy (want " + policyKeys + ")"},
		{"<<: {listn: ':1'}\n" + pol, "line 1: key listn not found (a top-level key; see slidegate serve --print-config)"},
		// An alias used where its node does not fit: the line is the anchor's.
		{pol + "admin_hosts: *p\n", "line 2: cannot unmarshal !!map into admin_hosts (a list of strings)"},
		{pol + "tls: *w\n", "line 2: cannot unmarshal !!str `60s` into tls (a mapping {cert_file, key_file, client_ca_file})"},
		{"headers: &h {draft: true}\n" + pol + "  - *h\n", "line 1: key draft not found in a policy (want " + policyKeys + ")"},
		{pol + "shutdown_timeout: *p\n", "line 2: cannot unmarshal !!map into shutdown_timeout (a duration with a unit, such as 60s, 1m30s or 24h)"},
		// A field type named by yaml.v3 (a map's elements, a type without
		// its own reader) is said in the configuration's words, not Go's.
		{"policies:\n  - {name: free, limit: 5, window: 60s, overrides: [a]}\n", "line 2: cannot unmarshal !!seq into overrides (a mapping from name to a whole number)"},
		{"default_policy: [free]\n" + pol, "line 1: cannot unmarshal !!seq into default_policy (the name of a policy)"},
	} {
		_, err := config.ParseConfig([]byte(c.yaml))
		if err == nil || !errors.Is(err, config.ErrConfig) || err.Error() != "config: "+c.want {
			t.Errorf("%q:\n  error %v\n  want  config: %s", c.yaml, err, c.want)
		}
	}
}

// TestConfigAliasBomb: aliases of aliases that stand for far more nodes
// than the file holds (billion laughs) are refused before anything is
// decoded, also where the expansion crosses the structs (routes of tiers
// of limits) that each decode their own node; so is an alias inside its
// own anchor.
func TestConfigAliasBomb(t *testing.T) {
	const pol = "policies:\n  - {name: free, limit: 5, window: 60s}\n"
	laughs := "store_options:\n  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
	for i := 1; i < 10; i++ {
		laughs += fmt.Sprintf("  l%d: &l%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*l%d, ", i-1), 10), ", "))
	}
	routes := "upstream: http://127.0.0.1:1\ntier_header: X-Plan\n" + pol +
		"routes:\n  - &r {path: /, limits: &l [" + strings.TrimSuffix(strings.Repeat("{policy: free}, ", 100), ", ") + "], tiers: {"
	for i := range 100 {
		routes += fmt.Sprintf("t%d: *l, ", i)
	}
	routes += "}}\n" + strings.Repeat("  - *r\n", 200)
	for name, y := range map[string]string{"laughs": laughs + pol, "routes": routes, "cycle": pol + "trusted_proxies: &c [*c]\n"} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := config.ParseConfig([]byte(y))
		runtime.ReadMemStats(&after)
		if err == nil || !errors.Is(err, config.ErrConfig) || !strings.Contains(err.Error(), "aliases expand the configuration past 1000000 nodes") {
			t.Errorf("%s: %v", name, err)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > 32<<20 {
			t.Errorf("%s: refusing it allocated %d MB", name, n>>20)
		}
	}
	// Aliases within the bound are read as written.
	c, err := config.ParseConfig([]byte("trusted_proxies: &t [10.0.0.0/8]\nadmin_hosts: *t\n" + pol))
	if err != nil || len(c.AdminHosts) != 1 || c.AdminHosts[0] != "10.0.0.0/8" {
		t.Errorf("a small alias: %v %v", err, c.AdminHosts)
	}
}
