package rls_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/rls"
)

// An envoyproxy/ratelimit configuration as its README shows them: nested
// descriptors, a value beating no value, unlimited, shadow mode, replaces.
const sampleConfig = `# comments are fine
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: remote_address
    value: 10.0.0.1
    rate_limit:
      unlimited: true
  - key: path
    value: /login
    descriptors:
      - key: remote_address
        rate_limit:
          name: login
          unit: second
          requests_per_unit: 2
  - key: plan
    value: free
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 100
  - key: user
    value: "bot-*"
    rate_limit:
      unit: day
      requests_per_unit: 0
  - key: api_key
    rate_limit:
      name: per_key
      unit: minute
      requests_per_unit: 50
      unit_multiplier: 2
  - key: api_key
    value: gold
    rate_limit:
      name: gold
      replaces:
        - name: per_key
      unit: minute
      requests_per_unit: 500
      window: 90s
      algorithm: counter
`

func TestParseSample(t *testing.T) {
	c, err := rls.ParseConfig("edge.yaml", []byte(sampleConfig))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Domains(); len(got) != 1 || got[0] != "edge" {
		t.Fatalf("domains %q", got)
	}
	want := []engine.Policy{
		{Name: "edge.remote_address", Limit: 10, Window: time.Minute},
		{Name: "login", Limit: 2, Window: time.Second},
		{Name: "edge.plan_free", Limit: 100, Window: time.Hour},
		{Name: "per_key", Limit: 50, Window: 2 * time.Minute},
		{Name: "gold", Limit: 500, Window: 90 * time.Second, Algorithm: engine.SlidingCounter},
	}
	got := c.Policies()
	if len(got) != len(want) {
		t.Fatalf("policies %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("policy %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	rules := c.Rules()
	if len(rules) != 7 {
		t.Fatalf("%d rules", len(rules))
	}
	paths := []string{"remote_address", "remote_address_10.0.0.1", "path_/login.remote_address", "plan_free", "user_bot-*", "api_key", "api_key_gold"}
	for i, r := range rules {
		if r.Path != paths[i] {
			t.Errorf("rule %d path %q, want %q", i, r.Path, paths[i])
		}
	}
	if !rules[1].Unlimited || rules[1].Policy != -1 || !rules[3].Shadow || rules[4].Limit != 0 || rules[4].Policy != -1 {
		t.Errorf("rules %+v", rules)
	}
	if rules[2].Line != 16 {
		t.Errorf("login rule on line %d, want 16 (its rate_limit key)", rules[2].Line)
	}
}

// Every configuration error names the file and the line at fault.
func TestConfigErrorsNameTheLine(t *testing.T) {
	for _, c := range []struct {
		name, yaml, want string
	}{
		{"unknown top key", "domain: d\ndescriptor: []\n", `f.yaml:2: the file: unknown key "descriptor"`},
		{"unknown descriptor key", "domain: d\ndescriptors:\n  - key: a\n    vaule: b\n", `f.yaml:4: a descriptor: unknown key "vaule"`},
		{"unknown rate_limit key", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_second: 1\n", `f.yaml:6: rate_limit: unknown key "requests_per_second"`},
		{"bad unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n", `f.yaml:5: unknown unit "fortnight"`},
		{"negative limit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n", `f.yaml:6: requests_per_unit -1 is outside`},
		{"text limit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: many\n", `f.yaml:6: requests_per_unit must be an integer`},
		{"no unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      requests_per_unit: 1\n", `f.yaml:4: rate_limit needs a unit`},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n", `f.yaml:6: an unlimited rate_limit takes no unit`},
		{"bad bool", "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n    rate_limit: {unit: second, requests_per_unit: 1}\n", `f.yaml:4: shadow_mode must be true or false`},
		{"duplicate", "domain: d\ndescriptors:\n  - key: a\n  - key: a\n", `f.yaml:4: duplicate descriptor "a"`},
		{"no key", "domain: d\ndescriptors:\n  - value: a\n", `f.yaml:3: descriptor has no key`},
		{"no domain", "descriptors: []\n", `f.yaml:1: domain is missing`},
		{"empty domain", "domain: ''\n", `f.yaml:1: domain: empty`},
		{"bad window", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      window: soon\n", `f.yaml:7: window "soon"`},
		{"limit above uint32", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 4294967296\n", `f.yaml:6: requests_per_unit 4294967296 is outside`},
		{"log limit too high for an explicit log", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      algorithm: log\n      requests_per_unit: 100000000\n", `f.yaml:7: requests_per_unit 100000000 is above the exact log's`},
		{"float", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1.5\n", `f.yaml:6: "1.5" is a float`},
		{"share_threshold without a wildcard", "domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n", `f.yaml:5: share_threshold can only be used with wildcard values`},
		{"empty replaces name", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: ''}]\n", `f.yaml:7: a replaces entry has no name`},
		{"list of scalars", "domain: d\ndescriptors:\n  - a\n", `f.yaml:3: descriptors: a list may hold mappings only`},
		{"self replace", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      name: x\n      unlimited: true\n      replaces: [{name: x}]\n", `f.yaml:7: a rate limit cannot replace itself`},
		{"descriptors not a list", "domain: d\ndescriptors: {key: a}\n", `f.yaml:2: descriptors must be a list`},
		{"yaml syntax", "domain: d\n  descriptors: [\n", `f.yaml: yaml: line`},
		{"empty file", "", `f.yaml: no domain`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := rls.ParseConfig("f.yaml", []byte(c.yaml))
			if err == nil || !errors.Is(err, rls.ErrConfig) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

// envoyproxy/ratelimit reads trees of any depth; so does slidegate, and a
// request with as many entries reaches the deepest rule.
func TestConfigDeep(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	indent := ""
	for i := 0; i < 20; i++ {
		b.WriteString(indent + "  - key: k\n")
		b.WriteString(indent + "    descriptors:\n")
		indent += "    "
	}
	b.WriteString(indent + "  - key: last\n" + indent + "    rate_limit: {unit: second, requests_per_unit: 1}\n")
	c, err := rls.ParseConfig("deep.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if rs := c.Rules(); len(rs) != 1 || strings.Count(rs[0].Path, ".") != 20 {
		t.Fatalf("rules %+v", rs)
	}
}

func TestLoadConfigDirectory(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"a.yaml":     "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"b.yml":      "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
		"notes.txt":  "not yaml: [",
		"c.yaml.bak": "domain: a\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c, err := rls.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if d := c.Domains(); len(d) != 2 || d[0] != "a" || d[1] != "b" || len(c.Policies()) != 2 {
		t.Fatalf("domains %q policies %+v", d, c.Policies())
	}
	if err := os.WriteFile(filepath.Join(dir, "z.yaml"), []byte("domain: a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := rls.LoadConfig(dir); err == nil || !strings.Contains(err.Error(), `z.yaml:1: domain "a" is configured twice`) {
		t.Fatalf("duplicate domain across files: %v", err)
	}
	if _, err := rls.LoadConfig(filepath.Join(dir, "missing.yaml")); !errors.Is(err, rls.ErrConfig) {
		t.Fatalf("missing file: %v", err)
	}
}

// TestConfigScalars: each field reads its scalar as envoyproxy/ratelimit's
// YAML library does: any scalar is a string, booleans in YAML 1.1's words,
// integers tagged as such (hex too), null as the zero value, and a node
// of the wrong kind refused with the field's name and line.
func TestConfigScalars(t *testing.T) {
	const d = "domain: d\ndescriptors:\n  - key: a\n"
	for _, c := range []struct {
		name, yaml string
		rule       rls.Rule // compared on Path, Limit, Window, Shadow, Quota
	}{
		{"yaml 1.1 booleans", d + "    shadow_mode: Y\n    quota_mode: off\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			rls.Rule{Path: "a", Limit: 1, Window: time.Second, Shadow: true}},
		{"a quoted boolean word", d + "    shadow_mode: !!str yes\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			rls.Rule{Path: "a", Limit: 1, Window: time.Second, Shadow: true}},
		{"null flags and limit", d + "    shadow_mode: ~\n    quota_mode: N\n    rate_limit: {unit: second, requests_per_unit: ~}\n",
			rls.Rule{Path: "a", Limit: 0, Window: time.Second}},
		{"scalars as strings, a hex limit", "domain: d\ndescriptors:\n  - key: 5\n    value: true\n    rate_limit: {unit: minute, requests_per_unit: 0x10}\n",
			rls.Rule{Path: "5_true", Limit: 16, Window: time.Minute}},
		{"a null algorithm is the log", d + "    rate_limit: {unit: second, requests_per_unit: 1, algorithm: ~}\n",
			rls.Rule{Path: "a", Limit: 1, Window: time.Second}},
	} {
		cfg, err := rls.ParseConfig("f.yaml", []byte(c.yaml))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		rs := cfg.Rules()
		if len(rs) != 1 || rs[0].Path != c.rule.Path || rs[0].Limit != c.rule.Limit || rs[0].Window != c.rule.Window ||
			rs[0].Shadow != c.rule.Shadow || rs[0].Quota != c.rule.Quota || rs[0].Algorithm != engine.SlidingLog {
			t.Errorf("%s: rules %+v", c.name, rs)
		}
	}
	for _, c := range []struct{ name, yaml, want string }{
		{"a list for a string", "domain: d\ndescriptors:\n  - key: [{name: x}]\n", "f.yaml:3: key must be a string"},
		{"a list for a boolean", d + "    shadow_mode: [{name: x}]\n", `f.yaml:4: shadow_mode must be true or false, not ""`},
		{"a list for an integer", d + "    rate_limit: {unit: second, requests_per_unit: [{name: x}]}\n", `f.yaml:4: requests_per_unit must be an integer, not ""`},
		{"a string for an integer", d + "    rate_limit: {unit: second, requests_per_unit: !!str 5}\n", `f.yaml:4: requests_per_unit must be an integer, not "5"`},
		{"an integer out of range", d + "    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 0}\n", "f.yaml:4: unit_multiplier 0 is outside 1..31622400"},
		{"a null domain", "domain: ~\n", "f.yaml:1: domain: empty"},
		{"a null key", "domain: d\ndescriptors:\n  - key: !!null x\n", "f.yaml:3: descriptor has no key (or an empty one)"},
		{"a null window", d + "    rate_limit: {unit: second, requests_per_unit: 1, window: ~}\n", `f.yaml:4: window "" must be a duration`},
		{"a null algorithm on an unlimited rule", d + "    rate_limit: {unlimited: yes, algorithm: ~}\n", "f.yaml:4: an unlimited rate_limit takes no algorithm"},
		{"a null unit", d + "    rate_limit: {unit: ~, requests_per_unit: 1}\n", "f.yaml:4: rate_limit needs a unit"},
	} {
		_, err := rls.ParseConfig("f.yaml", []byte(c.yaml))
		if err == nil || !errors.Is(err, rls.ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
}
