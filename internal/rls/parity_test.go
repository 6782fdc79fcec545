package rls_test

import (
	"math"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/rls"
)

const parityConfig = `
domain: p
descriptors:
  - key: a
    rate_limit: {name: a, unit: minute, requests_per_unit: 5, replaces: [{name: b}]}
  - key: b
    rate_limit: {name: b, unit: minute, requests_per_unit: 5, replaces: [{name: c}]}
  - key: c
    rate_limit: {name: c, unit: minute, requests_per_unit: 5}
  - key: x
    rate_limit: {name: x, unit: minute, requests_per_unit: 5, replaces: [{name: y}]}
  - key: y
    rate_limit: {name: y, unit: minute, requests_per_unit: 5, replaces: [{name: x}]}
  - key: free
    rate_limit: {unlimited: true}
  - key: q
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: files
    value: "img*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: big
    rate_limit: {unit: second, requests_per_unit: 4294967295}
`

// replaces is decided over all matched rules at once, whatever the order;
// unlimited reports 4294967295 left; quota_mode reports OK and names the
// violation; share_threshold shares one key among a wildcard's values;
// a limit above the log's cap runs on the counter with a warning.
func TestPeerParity(t *testing.T) {
	e := start(t, parityConfig, envOpts{opts: []rls.Option{rls.WithDynamicMetadata(true), rls.WithRateLimitHeaders("", "", "")}})
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for _, order := range [][]string{{"a", "b", "c"}, {"c", "b", "a"}} {
		r := e.ask(t, "p", 0, desc(order[0], "1"), desc(order[1], "1"), desc(order[2], "1"))
		for i, k := range order {
			if limited := r.Statuses[i].CurrentLimit != nil; limited != (k == "a") {
				t.Fatalf("order %v: descriptor %s limited %v: %v", order, k, limited, r)
			}
		}
	}
	if r := e.ask(t, "p", 0, desc("x", "1"), desc("y", "1")); r.Statuses[0].CurrentLimit != nil || r.Statuses[1].CurrentLimit != nil {
		t.Fatalf("mutual replaces: %v", r)
	}
	if r := e.ask(t, "p", 0, desc("free", "1")); r.Statuses[0].LimitRemaining != math.MaxUint32 || r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("unlimited: %v", r)
	}
	e.ask(t, "p", 0, desc("q", "1"))
	r := e.ask(t, "p", 0, desc("q", "1"))
	v := r.DynamicMetadata.GetFields()["quotaModeViolations"].GetListValue().GetValues()
	if r.OverallCode != ok || r.Statuses[0].Code != ok || len(v) != 1 || v[0].GetNumberValue() != 0 ||
		!r.DynamicMetadata.GetFields()["quotaModeEnabled"].GetBoolValue() || r.DynamicMetadata.GetFields()["domain"].GetStringValue() != "p" {
		t.Fatalf("quota mode: %v", r)
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, over} {
		if r := e.ask(t, "p", 0, desc("files", []string{"img1", "img2", "img3"}[i])); r.OverallCode != want {
			t.Fatalf("share_threshold %d: %v", i, r)
		}
	}
	r = e.ask(t, "p", 0, desc("big", "1"))
	if r.OverallCode != ok || r.Statuses[0].LimitRemaining != math.MaxUint32-1 {
		t.Fatalf("big: %v", r)
	}
	h := map[string]string{}
	for _, x := range r.ResponseHeadersToAdd {
		h[x.Key] = x.Value
	}
	if h["RateLimit-Limit"] != "4294967295" || h["RateLimit-Remaining"] != "4294967294" || (h["RateLimit-Reset"] != "1" && h["RateLimit-Reset"] != "2") {
		t.Fatalf("headers %v", h)
	}
	w := e.cfg.Warnings()
	if len(w) != 2 || !strings.Contains(w[1], "above the counter's") || !strings.Contains(w[0], "test.yaml:24: p.big: requests_per_unit 4294967295 is above the exact log's") {
		t.Fatalf("warnings %q", w)
	}
	if rs := e.cfg.Rules(); rs[len(rs)-1].Algorithm != engine.SlidingCounter {
		t.Fatalf("big rule %+v", rs[len(rs)-1])
	}
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	named := 0
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			if mf.GetName() == rls.MetricAboveLog && hasLabel(m, "descriptor", "big") && m.GetGauge().GetValue() == 1 {
				named++
			}
		}
	}
	if named != 1 {
		t.Fatalf("%s names the big rule %d times", rls.MetricAboveLog, named)
	}
}

// Files envoyproxy/ratelimit accepts: valid keys out of place are ignored
// (with a warning), shadow_mode without a rate_limit, a rate_limit without
// requests_per_unit (0), an unlimited rule with an unknown unit, YAML 1.1
// booleans, and merged domains with MERGE_DOMAIN_CONFIG.
func TestPeerAcceptedFiles(t *testing.T) {
	for name, y := range map[string]string{
		"misplaced": "domain: d\nunit: second\ndescriptors:\n  - key: a\n    requests_per_unit: 3\n",
		"shadow":    "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: true\n",
		"zero":      "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second}\n",
		"unlimited": "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: fortnight, requests_per_unit: 3}\n",
		"yes":       "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: yes\n    detailed_metric: on\n    value_to_metric: true\n    rate_limit: {unit: SECOND, requests_per_unit: 1}\n",
	} {
		if _, err := rls.ParseConfig(name+".yaml", []byte(y)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	files := map[string][]byte{
		"1.yaml": []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n"),
		"2.yaml": []byte("domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n"),
	}
	if _, err := rls.ParseConfigs(files, false); err == nil || !strings.Contains(err.Error(), `2.yaml:1: domain "d" is configured twice`) {
		t.Fatalf("without merge: %v", err)
	}
	c, err := rls.ParseConfigs(files, true)
	if err != nil || len(c.Rules()) != 2 {
		t.Fatalf("merge: %v %v", c, err)
	}
}
