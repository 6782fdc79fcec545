package envoy

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/internal/rls"
)

// Cases the peer's fixtures do not cover, one point each.
var configCases = map[string]string{
	"quota_mode.yaml":           "domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
	"value_to_metric.yaml":      "domain: d\ndescriptors:\n  - key: a\n    value_to_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
	"detailed_metric.yaml":      "domain: d\ndescriptors:\n  - key: a\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
	"big_limit.yaml":            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 4294967295}\n",
	"above_uint32.yaml":         "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n",
	"negative_limit.yaml":       "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
	"text_limit.yaml":           "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: many}\n",
	"float_limit.yaml":          "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n",
	"no_requests_per_unit.yaml": "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second}\n",
	"no_unit.yaml":              "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 3}\n",
	"upper_unit.yaml":           "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: MINUTE, requests_per_unit: 3}\n",
	"week.yaml":                 "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: week, requests_per_unit: 3}\n",
	"shadow_no_limit.yaml":      "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: true\n",
	"unlimited_bad_unit.yaml":   "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: fortnight}\n",
	"unlimited_limit.yaml":      "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, requests_per_unit: 4}\n",
	"misplaced_key.yaml":        "domain: d\nunit: second\ndescriptors:\n  - key: a\n    requests_per_unit: 3\n",
	"unknown_key.yaml":          "domain: d\ndescriptors:\n  - key: a\n    limit: 3\n",
	"yaml11_bool.yaml":          "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: yes\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
	"bad_bool.yaml":             "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
	"int_key.yaml":              "domain: d\ndescriptors:\n  - key: 5\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
	"two_documents.yaml":        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n---\ndomain: e\n",
	"no_descriptors.yaml":       "domain: d\n",
	"empty.yaml":                "",
	"no_domain.yaml":            "descriptors:\n  - key: a\n",
	"duplicate_kv.yaml":         "domain: d\ndescriptors:\n  - key: a\n    value: b_c\n  - key: a_b\n    value: c\n",
	"deep.yaml":                 "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        descriptors:\n          - key: c\n            descriptors:\n              - key: d\n                rate_limit: {unit: second, requests_per_unit: 1}\n",
	"wildcard_key.yaml":         "domain: d\ndescriptors:\n  - key: a*\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
	"share_no_wildcard.yaml":    "domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n",
	"share_nested.yaml":         "domain: d\ndescriptors:\n  - key: a\n    value: b*\n    share_threshold: true\n    descriptors:\n      - key: c\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
	"replaces_no_name.yaml":     "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{}]}\n",
	"rate_limit_null.yaml":      "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n",
	"rate_limit_scalar.yaml":    "domain: d\ndescriptors:\n  - key: a\n    rate_limit: 5\n",
	"descriptors_map.yaml":      "domain: d\ndescriptors: {key: a}\n",
	"list_of_strings.yaml":      "domain: d\ndescriptors:\n  - a\n",
	"yaml_syntax.yaml":          "domain: d\n  descriptors: [\n",
	"anchor.yaml":               "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &r {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: *r\n",
}

// fileLine matches an error that names a line of the file: "name:12:" or
// the YAML parser's "line 12".
func fileLine(name string) *regexp.Regexp {
	return regexp.MustCompile(regexp.QuoteMeta(name) + `(:\d+:|: yaml: line \d+|: no domain)`)
}

// Every file the peer's offline checker accepts, slidegate accepts; every
// file it refuses, slidegate refuses, naming the file and line.
func TestConfigParity(t *testing.T) {
	e := needEnv(t)
	corpus := map[string]string{}
	for _, glob := range []string{"test/config/*.yaml", "examples/ratelimit/config/*.yaml",
		"test/integration/runtime/current/ratelimit/config/*.yaml", "test/integration/runtime/current/ratelimit/*.yaml"} {
		ms, err := filepath.Glob(filepath.Join(e.src, glob))
		if err != nil || len(ms) == 0 {
			t.Fatalf("%s: %v (no files)", glob, err)
		}
		for _, m := range ms {
			b, err := os.ReadFile(m)
			if err != nil {
				t.Fatal(err)
			}
			corpus["peer/"+strings.ReplaceAll(strings.TrimPrefix(m, e.src+"/"), "/", "_")] = string(b)
		}
	}
	for k, v := range configCases {
		corpus["case/"+k] = v
	}
	names := make([]string, 0, len(corpus))
	for n := range corpus {
		names = append(names, n)
	}
	slices.Sort(names)
	var accepted, refused int
	for _, n := range names {
		base := filepath.Base(n)
		_, dir := writeRuntime(t, map[string]string{base: corpus[n]})
		peerErr := checkPeer(e, dir, false)
		_, sgErr := rls.LoadDir(dir, rls.LoadOptions{AllFiles: true})
		switch {
		case peerErr == nil && sgErr != nil:
			t.Errorf("%s: the peer accepts it, slidegate refuses: %v", n, sgErr)
		case peerErr != nil && sgErr == nil:
			t.Errorf("%s: the peer refuses it (%v), slidegate accepts", n, peerErr)
		case peerErr != nil:
			refused++
			if !fileLine(base).MatchString(sgErr.Error()) {
				t.Errorf("%s: slidegate's refusal names no line: %v", n, sgErr)
			}
		default:
			accepted++
		}
	}
	// MERGE_DOMAIN_CONFIG: the peer's two fixtures of one domain.
	pair := map[string]string{}
	for _, f := range []string{"merge_domain_key1.yaml", "merge_domain_key2.yaml"} {
		b, err := os.ReadFile(filepath.Join(e.src, "test/config", f))
		if err != nil {
			t.Fatal(err)
		}
		pair[f] = string(b)
	}
	_, dir := writeRuntime(t, pair)
	for _, merge := range []bool{false, true} {
		peerErr := checkPeer(e, dir, merge)
		_, sgErr := rls.LoadDir(dir, rls.LoadOptions{AllFiles: true, Merge: merge})
		if (peerErr == nil) != (sgErr == nil) {
			t.Errorf("merge %v: peer %v, slidegate %v", merge, peerErr, sgErr)
		} else if peerErr == nil {
			accepted++
		} else {
			refused++
		}
	}
	t.Logf("config parity: %d files and directories, %d accepted by both, %d refused by both", accepted+refused, accepted, refused)
}
