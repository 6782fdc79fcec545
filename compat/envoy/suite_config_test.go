package envoy

import (
	"fmt"
	"regexp"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// peerFixture reads one of the peer's test/config files.
func peerFixture(t *testing.T, e env, name string) string {
	return peerFile(t, e, "test/config/"+name)
}

// refusedCase is one of the peer's expectConfigPanic tests: the files,
// the test's message after its "file: " prefix, and what slidegate's
// message must say (the file, a line, the same fault).
func refusedCase(t *testing.T, e env, name string, fixtures []string, peerMsg, sg string, env map[string]string) suiteCase {
	files := map[string]string{}
	for _, f := range fixtures {
		dst := f
		if _, dup := files[dst]; dup {
			dst = "copy/" + f
		}
		files[dst] = peerFixture(t, e, f)
	}
	// The test's message names the file loaded last. The test fixes the
	// order; the running peer loads the directory in no fixed order, so
	// the message may name any of the files.
	var msgs []string
	for _, f := range fixtures {
		msgs = append(msgs, f+": "+peerMsg)
	}
	return suiteCase{name: name, files: files, env: env, refused: &refusal{peer: msgs, sg: regexp.MustCompile(sg)}}
}

func ovr(r *rlsv3.RateLimitRequest, n uint32, unit typev3.RateLimitUnit) *rlsv3.RateLimitRequest {
	r.Descriptors[0].Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: unit}
	return r
}

// test/config/config_test.go: which configurations load and what limit
// each request finds (GetLimit); which are refused and with what message.
// The stats keys the peer's tests also assert are not observable over
// gRPC (statsd): those assertions are not translated.
func TestPeerSuiteConfig(t *testing.T) {
	e := needEnv(t)
	const td = "test-domain"
	basic := map[string]string{"basic_config.yaml": peerFixture(t, e, "basic_config.yaml")}
	cases := []suiteCase{
		{name: "TestBasicConfig", files: basic, check: func(c *chk) {
			c.limit(req("foo_domain", []string{}), nil)
			c.limit(req(td, []string{}), nil)
			c.limit(req(td, []string{"key1", "something"}), nil)
			c.limit(req(td, []string{"key1", "value1"}), nil)
			c.limit(req(td, []string{"key2", "value2", "subkey", "subvalue"}), nil)
			c.limit(req(td, []string{"key5", "value5", "subkey5", "subvalue"}), nil)
			c.limit(req(td, []string{"key1", "value1", "subkey1", "something"}), &lim{5, perSecond, ""})
			c.limit(req(td, []string{"key1", "value1", "subkey1", "subvalue1"}), &lim{10, perSecond, ""})
			c.limit(req(td, []string{"key2", "something"}), &lim{20, perMinute, ""})
			c.limit(req(td, []string{"key2", "value2"}), &lim{30, perMinute, ""})
			c.limit(req(td, []string{"key2", "value3"}), nil)
			c.limit(req(td, []string{"key3", "foo"}), &lim{1, perHour, ""})
			c.limit(req(td, []string{"key4", "foo"}), &lim{1, perDay, "key4_rate_limit"})
			c.limit(req(td, []string{"key7", "unspecified_value"}), &lim{70, perMinute, ""})
			c.limit(req(td, []string{"key7", "another_value"}), &lim{70, perMinute, ""})
			// key6 is unlimited: the request is OK whatever it costs.
			for range 3 {
				if r := c.call(req(td, []string{"key6", "foo"})); r != nil && r.OverallCode != rlsv3.RateLimitResponse_OK {
					c.errorf("key6 (unlimited): %v", r.OverallCode)
				}
			}
		}},
		{name: "TestDomainMerge", env: map[string]string{"MERGE_DOMAIN_CONFIG": "true"},
			files: map[string]string{"merge_domain_key1.yaml": peerFixture(t, e, "merge_domain_key1.yaml"), "merge_domain_key2.yaml": peerFixture(t, e, "merge_domain_key2.yaml")},
			check: func(c *chk) {
				c.limit(req("foo_domain", []string{}), nil)
				c.limit(req(td, []string{}), nil)
				c.limit(req(td, []string{"key1", "value1"}), &lim{10, perMinute, ""})
				c.limit(req(td, []string{"key2", "value2"}), &lim{20, perMinute, ""})
			}},
		{name: "TestConfigLimitOverride", files: basic, check: func(c *chk) {
			c.limit(ovr(req("foo_domain", []string{}), 10, typev3.RateLimitUnit_DAY), nil)
			c.limit(ovr(req(td, []string{"key1", "value1", "subkey1", "something"}), 10, typev3.RateLimitUnit_DAY), &lim{10, perDay, ""})
			c.limit(ovr(req(td, []string{"key1", "value1", "subkey1", "something"}), 42, typev3.RateLimitUnit_HOUR), &lim{42, perHour, ""})
			c.limit(ovr(req(td, []string{"key1", "value1", "subkey1", "something_else"}), 42, typev3.RateLimitUnit_HOUR), &lim{42, perHour, ""})
		}},
		refusedCase(t, e, "TestEmptyDomain", []string{"empty_domain.yaml"}, "config file cannot have empty domain",
			`empty_domain\.yaml:\d+: domain is missing`, nil),
		refusedCase(t, e, "TestDuplicateDomain", []string{"basic_config.yaml", "duplicate_domain.yaml"}, "duplicate domain 'test-domain' in config file",
			`(basic_config|duplicate_domain)\.yaml:\d+: domain "test-domain" is configured twice`, nil),
		refusedCase(t, e, "TestEmptyKey", []string{"empty_key.yaml"}, "descriptor has empty key",
			`empty_key\.yaml:\d+: descriptor has no key`, nil),
		refusedCase(t, e, "TestDuplicateKey", []string{"duplicate_key.yaml"}, "duplicate descriptor composite key 'test-domain.key1_value1'",
			`duplicate_key\.yaml:\d+: duplicate descriptor "key1_value1"`, nil),
		refusedCase(t, e, "TestDuplicateKeyDomainMerge", []string{"merge_domain_key1.yaml", "merge_domain_key1.yaml"}, "duplicate descriptor composite key 'test-domain.key1_value1'",
			`merge_domain_key1\.yaml:\d+: duplicate descriptor "key1_value1"`, map[string]string{"MERGE_DOMAIN_CONFIG": "true"}),
		refusedCase(t, e, "TestBadLimitUnit", []string{"bad_limit_unit.yaml"}, "invalid rate limit unit 'foo'",
			`bad_limit_unit\.yaml:\d+: unknown unit "foo"`, nil),
		refusedCase(t, e, "TestReplacesSelf", []string{"replaces_self.yaml"}, "replaces should not contain name of same descriptor",
			`replaces_self\.yaml:\d+: a rate limit cannot replace itself \("self"\)`, nil),
		refusedCase(t, e, "TestReplacesEmpty", []string{"replaces_empty.yaml"}, "should not have an empty replaces entry",
			`replaces_empty\.yaml:\d+: a replaces entry has no name`, nil),
		refusedCase(t, e, "TestBadYaml", []string{"bad_yaml.yaml"}, "error loading config file: yaml: line 2: found unexpected end of stream",
			`bad_yaml\.yaml: yaml: line 2: found unexpected end of stream`, nil),
		refusedCase(t, e, "TestMisspelledKey/misspelled_key", []string{"misspelled_key.yaml"}, "config error, unknown key 'ratelimit'",
			`misspelled_key\.yaml:\d+: .*unknown key "ratelimit"`, nil),
		refusedCase(t, e, "TestMisspelledKey/misspelled_key2", []string{"misspelled_key2.yaml"}, "config error, unknown key 'requestsperunit'",
			`misspelled_key2\.yaml:\d+: .*unknown key "requestsperunit"`, nil),
		refusedCase(t, e, "TestNonStringKey", []string{"non_string_key.yaml"}, "config error, key is not of type string: 0.25",
			`non_string_key\.yaml:\d+: .*a key must be a string, not "0\.25"`, nil),
		refusedCase(t, e, "TestNonMapList", []string{"non_map_list.yaml"}, "config error, yaml file contains list of type other than map: a",
			`non_map_list\.yaml:\d+: descriptors: a list may hold mappings only`, nil),
		refusedCase(t, e, "TestUnlimitedWithRateLimitUnit", []string{"unlimited_with_unit.yaml"}, "should not specify rate limit unit when unlimited",
			`unlimited_with_unit\.yaml:\d+: an unlimited rate_limit takes no unit`, nil),
		{name: "TestShadowModeConfig", files: map[string]string{"shadow.yaml": peerFixture(t, e, "shadowmode_config.yaml")}, minute: true, check: func(c *chk) {
			c.limit(req(td, []string{"key1", "value1", "subkey1", "something"}), &lim{5, perSecond, ""})
			c.limit(req(td, []string{"key1", "value1", "subkey1", "subvalue1"}), &lim{10, perSecond, ""})
			c.limit(req(td, []string{"key2", "something"}), &lim{20, perMinute, ""})
			c.limit(req(td, []string{"key2", "value2"}), &lim{30, perMinute, ""})
			// ShadowMode true: past the limit the answer stays OK.
			shadowOK := func(kv []string, n int) {
				for i := range n {
					if r := c.call(req(td, kv)); r != nil && r.OverallCode != rlsv3.RateLimitResponse_OK {
						c.errorf("%v (shadow mode) request %d: %v", kv, i+1, r.OverallCode)
						return
					}
				}
			}
			shadowOK([]string{"key1", "value1", "subkey1", "subvalue1"}, 12)
			shadowOK([]string{"key2", "something"}, 21)
			// ShadowMode false: the 31st of 30 per minute is refused.
			var last *rlsv3.RateLimitResponse
			for range 30 {
				last = c.call(req(td, []string{"key2", "value2"}))
			}
			if last != nil && last.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
				c.errorf("key2=value2 (not shadow), the 31st of 30 per minute: %v", last.OverallCode)
			}
		}},
		{name: "TestWildcardConfig", files: map[string]string{"wildcard.yaml": peerFixture(t, e, "wildcard.yaml")}, check: func(c *chk) {
			c.limit(req(td, []string{"noVal", "foo1"}), &lim{20, perMinute, ""})
			c.limit(req(td, []string{"noVal", "foo2"}), &lim{20, perMinute, ""})
			c.limit(req(td, []string{"wild", "foo1"}), &lim{20, perMinute, ""})
			c.limit(req(td, []string{"wild", "foo2"}), &lim{20, perMinute, ""})
			c.limit(req(td, []string{"nestedWild", "val1", "wild", "goo2"}), &lim{20, perMinute, ""})
			c.limit(req(td, []string{"wild", "bar"}), nil)
			c.limit(req(td, []string{"noWild", "foo1"}), nil)
			c.limit(req(td, []string{"midWildcard", "barab"}), nil)
		}},
	}
	cases = append(cases, metricCases(t, e)...)
	runSuite(t, "test/config", cases)
}

// yamlCase is one of the peer's tests whose configuration is inline Go:
// written out as YAML, it loads, and each request finds its limit.
func yamlCase(name, domain, yaml string, merge bool, reqs []limitReq) suiteCase {
	sc := suiteCase{name: name, files: map[string]string{"inline.yaml": yaml}, check: func(c *chk) {
		for _, r := range reqs {
			c.limit(req(domain, r.kv), r.want)
		}
	}}
	if merge {
		sc.env = map[string]string{"MERGE_DOMAIN_CONFIG": "true"}
	}
	return sc
}

type limitReq struct {
	kv   []string
	want *lim
}

// metricCases: TestDetailedMetric, TestValueToMetric_*, TestShareThreshold
// and TestWildcardStatsBehavior. Their stats keys are not observable;
// what is: each configuration loads, each request finds the limit the
// test reads, and share_threshold values share one counter.
func metricCases(t *testing.T, e env) []suiteCase {
	nested := func(detailed1, detailed2 bool) string {
		return fmt.Sprintf("domain: nested\ndescriptors:\n  - key: key-1\n    detailed_metric: %v\n    rate_limit: {requests_per_unit: 100, unit: minute}\n    descriptors:\n      - key: key-2\n        detailed_metric: %v\n        rate_limit: {requests_per_unit: 5, unit: minute}\n", detailed1, detailed2)
	}
	realistic := `domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: {requests_per_unit: 500, unit: minute}
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {requests_per_unit: 500, unit: minute}
  - key: key_2
    detailed_metric: true
    rate_limit: {requests_per_unit: 5000, unit: minute}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {requests_per_unit: 5, unit: minute}
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit: {requests_per_unit: 50000, unit: minute}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {requests_per_unit: 100, unit: minute}
`
	m100, m5 := &lim{100, perMinute, ""}, &lim{5, perMinute, ""}
	chain := func(domain string, f1, f2, f3 string, rpu uint32, unit string) string {
		return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: route\n%s    descriptors:\n      - key: http_method\n%s        descriptors:\n          - key: subject_id\n%s            rate_limit: {requests_per_unit: %d, unit: %s}\n", domain, f1, f2, f3, rpu, unit)
	}
	v2m, v2mIn, dmIn := "    value_to_metric: true\n", "        value_to_metric: true\n", "            detailed_metric: true\n"
	m60 := &lim{60, perMinute, ""}
	wild := func(flags string) string {
		return "domain: test-domain\ndescriptors:\n  - key: wild\n    value: foo*\n" + flags + "    rate_limit: {requests_per_unit: 20, unit: minute}\n"
	}
	m20 := &lim{20, perMinute, ""}
	out := []suiteCase{
		yamlCase("TestDetailedMetric/nested_with_no_values_but_request_only_top-level_key", "nested", nested(true, false), true,
			[]limitReq{{[]string{"key-1", "value-1"}, m100}}),
		yamlCase("TestDetailedMetric/nested_with_no_values_but_request_only_top-level_key_with_no_detailed_metric", "nested", nested(false, false), true,
			[]limitReq{{[]string{"key-1", "value-1"}, m100}}),
		yamlCase("TestDetailedMetric/nested_with_no_values_and_request_fully_nested_descriptors", "nested", nested(true, true), true,
			[]limitReq{{[]string{"key-1", "value-1", "key-2", "value-2"}, m5}}),
		yamlCase("TestDetailedMetric/nested_with_no_values_and_request_fully_nested_descriptors_with_no_detailed_metric", "nested", nested(false, false), true,
			[]limitReq{{[]string{"key-1", "value-1", "key-2", "value-2"}, m5}}),
		yamlCase("TestDetailedMetric/test_nested_descriptors_with_simple_request", "nested", realistic, true,
			[]limitReq{{[]string{"key_1", "value-for-key-1"}, &lim{500, perMinute, ""}}}),
		yamlCase("TestDetailedMetric/test_nested_only_second_descriptor_request_not_nested", "nested", realistic, true,
			[]limitReq{{[]string{"key_2", "key-2-value"}, &lim{5000, perMinute, ""}}}),
		yamlCase("TestDetailedMetric/test_nested_descriptors_with_nested_request", "nested", realistic, true,
			[]limitReq{{[]string{"key_2", "key-2-value", "key_3", "requested-key3-value"}, m5}}),
		yamlCase("TestValueToMetric_UsesRuntimeValuesInStats", "domain", chain("domain", v2m, v2mIn, "", 60, "minute"), false,
			[]limitReq{{[]string{"route", "draw", "http_method", "GET", "subject_id", "123"}, m60}}),
		yamlCase("TestValueToMetric_DefaultKeyIncludesValueAtThatLevel", "d",
			"domain: d\ndescriptors:\n  - key: k1\n    value_to_metric: true\n    descriptors:\n      - key: k2\n        rate_limit: {requests_per_unit: 1, unit: second}\n", false,
			[]limitReq{{[]string{"k1", "A", "k2", "foo"}, &lim{1, perSecond, ""}}}),
		yamlCase("TestValueToMetric_MidLevelOnly", "d",
			"domain: d\ndescriptors:\n  - key: k1\n    descriptors:\n      - key: k2\n        value_to_metric: true\n        descriptors:\n          - key: k3\n            rate_limit: {requests_per_unit: 1, unit: second}\n", false,
			[]limitReq{{[]string{"k1", "X", "k2", "Y", "k3", "Z"}, &lim{1, perSecond, ""}}}),
		yamlCase("TestValueToMetric_NoFlag_Unchanged", "d",
			"domain: d\ndescriptors:\n  - key: k1\n    descriptors:\n      - key: k2\n        rate_limit: {requests_per_unit: 1, unit: second}\n", false,
			[]limitReq{{[]string{"k1", "X", "k2", "Y"}, &lim{1, perSecond, ""}}}),
		yamlCase("TestValueToMetric_DoesNotOverrideDetailedMetric", "domain", chain("domain", v2m, v2mIn, dmIn, 60, "minute"), false,
			[]limitReq{{[]string{"route", "draw", "http_method", "GET", "subject_id", "123"}, m60}}),
		yamlCase("TestValueToMetric_WithConfiguredValues", "test-domain", `domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 60, unit: minute}
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 30, unit: minute}
`, false, []limitReq{{[]string{"route", "api", "http_method", "GET", "subject_id", "user123"}, m60},
			{[]string{"route", "api", "http_method", "POST", "subject_id", "user456"}, &lim{30, perMinute, ""}}}),
		yamlCase("TestValueToMetric_WithWildcard", "domain", `domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {requests_per_unit: 100, unit: minute}
`, false, []limitReq{{[]string{"user", "alice", "action", "readfile", "resource", "documents"}, m100},
			{[]string{"user", "bob", "action", "readdata", "resource", "database"}, m100}}),
		yamlCase("TestValueToMetric_WithEmptyValue", "domain", chain("domain", v2m, v2mIn, "", 60, "minute"), false,
			[]limitReq{{[]string{"route", "", "http_method", "GET", "subject_id", "123"}, m60},
				{[]string{"route", "draw", "http_method", "", "subject_id", "123"}, m60},
				{[]string{"route", "", "http_method", "", "subject_id", "123"}, m60}}),
	}
	full := suiteCase{name: "TestValueToMetric_FullKeyMatchesStatsKey", files: map[string]string{
		"a.yaml": chain("test-domain", v2m, v2mIn, "", 60, "minute"),
		"b.yaml": chain("test-domain-2", "", "", "", 60, "minute"),
		"c.yaml": chain("test-domain-3", "", "", dmIn, 60, "minute")}, check: func(c *chk) {
		for _, d := range []string{"test-domain", "test-domain-2", "test-domain-3"} {
			c.limit(req(d, []string{"route", "api", "http_method", "GET", "subject_id", "user123"}), m60)
		}
	}}
	share := peerFixture(t, e, "share_threshold.yaml")
	td := "test-domain"
	out = append(out, full,
		suiteCase{name: "TestShareThreshold/Basic_share_threshold", files: map[string]string{"share.yaml": share}, minute: true, check: func(c *chk) {
			// One counter for every value of files/*: 100, then 99, 98 left.
			for i, v := range []string{"files/a.pdf", "files/b.csv", "files/c.txt"} {
				if st := c.limit(req(td, []string{"files", v}), m100); st != nil && st.LimitRemaining != uint32(99-i) {
					c.errorf("files=%s: remaining %d, want %d (one shared counter)", v, st.LimitRemaining, 99-i)
				}
			}
		}},
		yamlCase("TestShareThreshold/share_threshold_with_metrics", td, share, false,
			[]limitReq{{[]string{"route", "api/v1", "method", "GET"}, m60}, {[]string{"service", "svc/user", "endpoint", "get"}, &lim{80, perMinute, ""}}}),
		yamlCase("TestShareThreshold/Nested_wildcards", td, share, false,
			[]limitReq{{[]string{"nested", "parent", "files", "nested/file1.txt"}, &lim{200, perMinute, ""}},
				{[]string{"files", "top/file1.txt", "files", "nested/file1.txt"}, &lim{300, perMinute, ""}},
				{[]string{"path", "path/foo", "file", "file/doc1", "type", "pdf"}, &lim{120, perMinute, ""}},
				{[]string{"user", "user/alice", "resource", "res/file1", "action", "read"}, &lim{150, perMinute, ""}}}),
		suiteCase{name: "TestShareThreshold/Explicit_value_precedence_over_wildcard", files: map[string]string{"share.yaml": share}, minute: true, check: func(c *chk) {
			if st := c.limit(req(td, []string{"file", "test1"}), &lim{50, perMinute, ""}); st != nil && st.LimitRemaining != 49 {
				c.errorf("file=test1: remaining %d, want 49 (its own counter)", st.LimitRemaining)
			}
			for i, v := range []string{"test2", "test23", "test123"} {
				if st := c.limit(req(td, []string{"file", v}), m100); st != nil && st.LimitRemaining != uint32(99-i) {
					c.errorf("file=%s: remaining %d, want %d (one shared counter)", v, st.LimitRemaining, 99-i)
				}
			}
		}},
		yamlCase("TestWildcardStatsBehavior/No_flags", td, wild(""), false, []limitReq{{[]string{"wild", "foo1"}, m20}}),
		yamlCase("TestWildcardStatsBehavior/value_to_metric", td, wild("    value_to_metric: true\n"), false, []limitReq{{[]string{"wild", "foo1"}, m20}}),
		yamlCase("TestWildcardStatsBehavior/share_threshold", td, wild("    share_threshold: true\n"), false, []limitReq{{[]string{"wild", "foo1"}, m20}}),
		yamlCase("TestWildcardStatsBehavior/share_threshold_with_value_to_metric", td, wild("    share_threshold: true\n    value_to_metric: true\n"), false, []limitReq{{[]string{"wild", "foo1"}, m20}}),
		yamlCase("TestWildcardStatsBehavior/value_to_metric_in_other_descriptor", td,
			"domain: test-domain\ndescriptors:\n  - key: wild\n    value: foo*\n    descriptors:\n      - key: other\n        value_to_metric: true\n        descriptors:\n          - key: limit\n            rate_limit: {requests_per_unit: 20, unit: minute}\n", false,
			[]limitReq{{[]string{"wild", "foo1", "other", "bar", "limit", "X"}, m20}}),
	)
	return out
}
