package config_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/internal/server/config"
)

// TestRouteConfigErrors: every mistake in routes names its field.
func TestRouteConfigErrors(t *testing.T) {
	const pol = "policies:\n  - {name: a, limit: 5, window: 1s}\n  - {name: b, limit: 5, window: 1h}\nroutes:\n"
	many := "[" + strings.Repeat("{policy: a, key: ip}, ", 0)
	for i := range config.MaxLimits + 1 {
		many += fmt.Sprintf("{policy: a, key: 'const:%d'},", i)
	}
	many += "]"
	for _, c := range []struct{ yaml, want string }{
		{"  - {path: api, limits: [{policy: a}]}", `routes[0].path: "api" must be a path prefix starting with /`},
		{"  - {path: /a/../b, limits: [{policy: a}]}", `routes[0].path: "/a/../b" is not a clean path (want "/b")`},
		{"  - {path: '/a?x=1', limits: [{policy: a}]}", `routes[0].path: "/a?x=1" holds`},
		{"  - {path: /a, method: get, limits: [{policy: a}]}", `routes[0].method: "get" is not an HTTP method in upper case`},
		{"  - {path: /a}", "routes[0].limits: missing"},
		{"  - {path: /a, limits: [{policy: c}]}", `routes[0].limits[0].policy: "c" is not the name of a policy`},
		{"  - {path: /a, limits: [{policy: a, key: cookie}]}", `routes[0].limits[0].key: key "cookie": want ip, header:NAME or const:VALUE`},
		{"  - {path: /a, limits: [{policy: a, key: 'const:'}]}", `routes[0].limits[0].key: key "const:": the constant must be 1 to`},
		{"  - {path: /a, limits: [{policy: a}, {policy: a, key: ip}]}", `routes[0].limits[1]: policy "a" with key "ip" is listed twice`},
		{"  - {path: /a, limits: " + many + "}", fmt.Sprintf("routes[0].limits: %d limits (want 1 to %d)", config.MaxLimits+1, config.MaxLimits)},
		{"  - {path: /a, limits: [{policy: a}], tiers: {'x y': [{policy: a}]}}", `routes[0].tiers.x y: tier name "x y"`},
		{"  - {path: /a, limits: [{policy: a}], tiers: {p: []}}", "routes[0].tiers.p: 0 limits"},
		{"  - {path: /a, limits: [{policy: a}]}\n  - {path: /a/, limits: [{policy: b}]}", "routes[1]: matches the same requests as routes[0] ((any method) /a)"},
		{"  - {path: /a, limits: [{policy: a}], methods: [GET]}", "key methods not found in a route (want method, path, limits, tiers, cluster_tag)"},
		{"  - {path: /a, limits: [{policy: a, keys: ip}]}", "key keys not found in a limit (want policy, key)"},
	} {
		_, err := config.ParseConfig([]byte(pol + c.yaml + "\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n  error %v\n  want it to contain %q", c.yaml, err, c.want)
		}
	}
	// Routes are gateway mode's: without an upstream, a warning says so.
	cfg, err := config.ParseConfig([]byte(pol + "  - {path: /a, limits: [{policy: a}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if w := strings.Join(cfg.Warnings(), "\n"); !strings.Contains(w, "routes apply to gateway mode") {
		t.Errorf("warnings: %s", w)
	}
	// Tiers without a tier header can never be chosen.
	cfg, err = config.ParseConfig([]byte("upstream: http://127.0.0.1:1\n" + pol + "  - {path: /a, limits: [{policy: a}], tiers: {p: [{policy: b}]}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if w := strings.Join(cfg.Warnings(), "\n"); !strings.Contains(w, "routes[0].tiers: no tier_header is set") {
		t.Errorf("warnings: %s", w)
	}
}

// TestDecisionHeadersConfig: decision_headers is checked like headers, in
// the configuration's words; the defaults show in --print-config's YAML;
// headers set without a gateway is a warning.
func TestDecisionHeadersConfig(t *testing.T) {
	const pol = "policies:\n  - {name: free, limit: 5, window: 60s}\n"
	for y, want := range map[string]string{
		"decision_headers: {x: yes}\n" + pol:            `x: "yes" is not true or false`,
		"decision_headers: {x: 1}\n" + pol:              `x: "1" is not true or false`,
		"decision_headers: {burst: true}\n" + pol:       "key burst not found in decision_headers (want draft, x, retry_after)",
		"decision_headers: {X-RateLimit: true}\n" + pol: "key X-RateLimit not found in decision_headers (want draft, x, retry_after)",
		"decision_headers: true\n" + pol:                "cannot unmarshal !!bool `true` into decision_headers",
		"decision_headers: [x]\n" + pol:                 "cannot unmarshal !!seq into decision_headers",
		"decision_header: {x: true}\n" + pol:            "key decision_header not found",
	} {
		_, err := config.ParseConfig([]byte(y))
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "line ") {
			t.Errorf("%q:\n  error %v\n  want it to contain %q and a line", y, err, want)
		}
	}
	c, err := config.ParseConfig([]byte(pol))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.DecisionHeaders.Which(), config.DefaultDecisionHeaders; got != want {
		t.Errorf("default decision headers %v, want %v", got, want)
	}
	out, err := c.Marshal()
	if err != nil || !strings.Contains(string(out), "decision_headers:\n    draft: false\n    x: false\n    retry_after: true\n") {
		t.Errorf("Marshal: %v\n%s", err, out)
	}
	if w := config.DefaultConfig().Warnings(); len(w) != 0 {
		t.Errorf("the default configuration warns: %q", w)
	}
	c, _ = config.ParseConfig([]byte("headers: {x: false}\n" + pol))
	if w := strings.Join(c.Warnings(), "\n"); !strings.Contains(w, "headers: applies to gateway mode (upstream) only") {
		t.Errorf("headers without upstream: warnings %q", w)
	}
}

// TestConfigMistakes (point 8): each mistake is an error naming the
// field, or a warning where it can be legitimate.
func TestConfigMistakes(t *testing.T) {
	const pol = "policies:\n  - {name: free, limit: 5, window: 60s}\n"
	for yaml, want := range map[string]string{
		"policies:\n  - {name: free, limit: 2.5, window: 60s}\n": `limit: "2.5" is not a whole number`,
		"max_batch: 1e2\n" + pol:                                 `max_batch: "1e2" is not a whole number`,
		"max_batch: many\n" + pol:                                `line 1: max_batch: "many" is not a whole number`,
		"shadow: maybe\n" + pol:                                  `shadow: "maybe" is not true or false`,
		"policies:\n  - {name: free, limit: 5, window: 60}\n":    `line 2: window: "60" is not a duration with a unit`,
		pol + "---\nlisten: 0.0.0.0:80\n":                        "a second YAML document",
		"store_options: {timeout: 1s}\n" + pol:                   "store_options: the memory store takes no options",
		"trusted_proxies: [0.0.0.0/0]\n" + pol:                   `trusted_proxies: "0.0.0.0/0" trusts every address`,
		"trusted_proxies: ['::/0']\n" + pol:                      `trusted_proxies: "::/0" trusts every address`,
		"trusted_proxies: ['::ffff:0.0.0.0/90']\n" + pol:         "shorter than /96",
		"read_timeout: 1ns\n" + pol:                              "read_timeout: 1ns is shorter than 1ms",
		"write_timeout: 10us\n" + pol:                            "write_timeout: 10µs is shorter than 1ms",
		"max_body_bytes: 100000000000\n" + pol:                   "max_body_bytes: 100000000000 is outside 1..67108864",
		"max_header_bytes: 100\n" + pol:                          "max_header_bytes: 100 is outside",
		"max_batch: 1000000\n" + pol:                             "max_batch: 1000000 is outside 1..10000",
		"client_ip_header: 'X Bad'\n" + pol:                      `client_ip_header: "X Bad" is not a header name`,
		"drain_delay: -1s\n" + pol:                               "drain_delay: -1s is negative",
		"store: redis://h:1/0\npolicies:\n  - {name: free, limit: 5, window: 60s, overflow: allow}\n": "policies[0] (free).overflow: needs max_keys",
		"policies:\n  - {name: free, limit: 5, window: 60s, max_keys: 10, overflow: maybe}\n":         `policies[0] (free).overflow: "maybe" is not refuse or allow`,
		"store: redis://h:1/0\npolicies:\n  - {name: free, limit: 5, window: 60s, max_keys: 10}\n":    "policies[0] (free).max_keys: applies to the memory store only",
	} {
		_, err := config.ParseConfig([]byte(yaml))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q:\n  error %v\n  want it to contain %q", yaml, err, want)
		}
	}
	for yaml, want := range map[string]string{
		"admin: 0.0.0.0:9090\n" + pol: "admin: 0.0.0.0:9090 is reachable from the network",
		"admin: ':9090'\n" + pol:      "admin: :9090 is reachable from the network",
	} {
		c, err := config.ParseConfig([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		if w := strings.Join(c.Warnings(), "\n"); !strings.Contains(w, want) {
			t.Errorf("%q: warnings %q, want %q", yaml, w, want)
		}
	}
	if w := config.DefaultConfig().Warnings(); len(w) != 0 {
		t.Errorf("the built-in configuration warns: %q", w)
	}

}
