package envoy

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
)

// st is one expected descriptor status: code, limit (nil: none; anyLim:
// not checked, where the peer's mock returned a value its real cache
// does not) and remaining (anyRem: not checked, likewise).
type st struct {
	code   rlsv3.RateLimitResponse_Code
	limit  *lim
	anyLim bool
	rem    uint32
	anyRem bool
}

var (
	codeOK   = rlsv3.RateLimitResponse_OK
	codeOver = rlsv3.RateLimitResponse_OVER_LIMIT
)

// expect sends r and checks the overall code and every status the peer's
// test asserts (AssertProtoEqual on code, current limit, remaining; the
// mock cache sets no duration_until_reset, so that is not compared).
func (c *chk) expect(r *rlsv3.RateLimitRequest, overall rlsv3.RateLimitResponse_Code, want ...st) *rlsv3.RateLimitResponse {
	resp := c.call(r)
	if resp == nil {
		return nil
	}
	where := reqString(r)
	if resp.OverallCode != overall {
		c.errorf("%s: overall %v, want %v", where, resp.OverallCode, overall)
	}
	if len(resp.Statuses) != len(want) {
		c.errorf("%s: %d statuses, want %d", where, len(resp.Statuses), len(want))
		return resp
	}
	for i, w := range want {
		g := resp.Statuses[i]
		if g.Code != w.code {
			c.errorf("%s: status %d %v, want %v", where, i, g.Code, w.code)
		}
		switch {
		case w.anyLim:
		case w.limit == nil && g.CurrentLimit != nil:
			c.errorf("%s: status %d limit %v, want none", where, i, g.CurrentLimit)
		case w.limit != nil && (g.CurrentLimit == nil || g.CurrentLimit.RequestsPerUnit != w.limit.rpu || g.CurrentLimit.Unit != w.limit.unit || g.CurrentLimit.Name != w.limit.name):
			c.errorf("%s: status %d limit %v, want %d/%v name %q", where, i, g.CurrentLimit, w.limit.rpu, w.limit.unit, w.limit.name)
		}
		if !w.anyRem && g.LimitRemaining != w.rem {
			c.errorf("%s: status %d remaining %d, want %d", where, i, g.LimitRemaining, w.rem)
		}
	}
	return resp
}

// exhaust sends n requests of one descriptor: a limit of n is then used up.
func (c *chk) exhaust(domain string, kv []string, n int) {
	for range n {
		c.call(req(domain, kv))
	}
}

// headers checks the response headers: names and values as the test's,
// the reset a number of seconds within the minute (the test's 58 is its
// mock clock's).
func (c *chk) headers(r *rlsv3.RateLimitResponse, limit, remaining, reset string) {
	if r == nil {
		return
	}
	var got []string
	for _, h := range r.ResponseHeadersToAdd {
		if h.Key == reset {
			if n, err := strconv.Atoi(h.Value); err != nil || n < 0 || n > 60 {
				c.errorf("header %s: %q, want seconds within the minute", h.Key, h.Value)
			}
			got = append(got, h.Key+"=…")
			continue
		}
		got = append(got, h.Key+"="+h.Value)
	}
	slices.Sort(got)
	want := []string{limit + "=10", remaining + "=0", reset + "=…"}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		c.errorf("headers %q, want %q", got, want)
	}
}

// refusedRequest checks a request answered with an error: the peer's
// test's exact message, or, from slidegate, its own words for the same
// fault.
func (c *chk) refusedRequest(r *rlsv3.RateLimitRequest, peerMsg string, sg *regexp.Regexp) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.p.rl.ShouldRateLimit(ctx, r)
	switch {
	case err == nil:
		c.errorf("%s: answered %v, want an error", reqString(r), resp)
	case c.p.who == whoPeer && status.Convert(err).Message() != peerMsg:
		c.errorf("%s: %v, want %q", reqString(r), err, peerMsg)
	case c.p.who == whoSG && !sg.MatchString(status.Convert(err).Message()):
		c.errorf("%s: %v, want a message matching %q", reqString(r), err, sg)
	}
}

// test/service/ratelimit_test.go: the service's answers, with the mocked
// configuration written as a file and the mocked cache's answers brought
// about by real requests (a limit used up first). Each check starts early
// in a clock minute so the peer's minute window holds.
func TestPeerSuiteService(t *testing.T) {
	const dd = "different-domain"
	m10 := &lim{10, perMinute, "key_name"}
	different := map[string]string{"different.yaml": "domain: different-domain\ndescriptors:\n  - key: foo\n    value: bar\n    rate_limit: {name: key_name, unit: minute, requests_per_unit: 10}\n"}
	overFooBar := func(c *chk) {
		c.exhaust(dd, []string{"foo", "bar"}, 10)
	}
	shadowRules := func(shadow1, shadow2 bool) map[string]string {
		return map[string]string{"shadow.yaml": "domain: different-domain\ndescriptors:\n  - key: foo\n    value: bar\n    shadow_mode: " + strconv.FormatBool(shadow1) +
			"\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: hello\n    value: world\n    shadow_mode: " + strconv.FormatBool(shadow2) +
			"\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"}
	}
	m10u := &lim{10, perMinute, ""}
	quota := func(k1 string, n1 int, q1 bool, k2 string, n2 int, q2 bool) map[string]string {
		return map[string]string{"quota.yaml": "domain: quota-domain\ndescriptors:\n  - key: " + k1 + "\n    value: limit\n    quota_mode: " + strconv.FormatBool(q1) +
			"\n    rate_limit: {unit: minute, requests_per_unit: " + strconv.Itoa(n1) + "}\n  - key: " + k2 + "\n    value: limit\n    quota_mode: " + strconv.FormatBool(q2) +
			"\n    rate_limit: {unit: minute, requests_per_unit: " + strconv.Itoa(n2) + "}\n"}
	}
	const qd = "quota-domain"
	m5, m3 := &lim{5, perMinute, ""}, &lim{3, perMinute, ""}
	cases := []suiteCase{
		{name: "TestService", files: different, minute: true, check: func(c *chk) {
			c.expect(req("test-domain", []string{"hello", "world"}), codeOK, st{code: codeOK})
			overFooBar(c)
			r := req(dd, []string{"foo", "bar"}, []string{"hello", "world"})
			c.expect(r, codeOver, st{code: codeOver, limit: m10}, st{code: codeOK})
			// A configuration that fails to load leaves the last one in force.
			if err := os.WriteFile(filepath.Join(c.dir, "broken.yaml"), []byte("domain: broken\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o644); err != nil {
				c.errorf("%v", err)
			}
			c.eventually("the failed load in the log", "logged", func() string {
				if strings.Contains(c.p.out.String(), "broken.yaml") {
					return "logged"
				}
				return "not logged"
			})
			c.expect(req(dd, []string{"hello", "world"}, []string{"foo", "bar"}), codeOver, st{code: codeOK}, st{code: codeOver, limit: m10})
		}},
		{name: "TestServiceGlobalShadowMode", files: different, minute: true, env: map[string]string{"SHADOW_MODE": "true"},
			check: func(c *chk) {
				overFooBar(c)
				c.expect(req(dd, []string{"foo", "bar"}, []string{"hello", "world"}), codeOK, st{code: codeOver, limit: m10}, st{code: codeOK})
			}},
		{name: "TestRuleShadowMode", files: shadowRules(true, true), minute: true, check: func(c *chk) {
			c.exhaust(dd, []string{"foo", "bar"}, 10)
			c.exhaust(dd, []string{"hello", "world"}, 10)
			// The mock's second status has no limit; the real cache's has.
			c.expect(req(dd, []string{"foo", "bar"}, []string{"hello", "world"}), codeOK, st{code: codeOK, limit: m10u}, st{code: codeOK, anyLim: true})
		}},
		{name: "TestMixedRuleShadowMode", files: shadowRules(true, false), minute: true, check: func(c *chk) {
			c.exhaust(dd, []string{"foo", "bar"}, 10)
			c.exhaust(dd, []string{"hello", "world"}, 10)
			c.expect(req(dd, []string{"foo", "bar"}, []string{"hello", "world"}), codeOver, st{code: codeOK, limit: m10u}, st{code: codeOver, anyLim: true})
		}},
		{name: "TestServiceWithCustomRatelimitHeaders", files: different, minute: true,
			env: map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_LIMIT_HEADER": "A-Ratelimit-Limit", "LIMIT_REMAINING_HEADER": "A-Ratelimit-Remaining", "LIMIT_RESET_HEADER": "A-Ratelimit-Reset"},
			check: func(c *chk) {
				overFooBar(c)
				r := c.expect(req(dd, []string{"foo", "bar"}, []string{"hello", "world"}), codeOver, st{code: codeOver, limit: m10}, st{code: codeOK})
				c.headers(r, "A-Ratelimit-Limit", "A-Ratelimit-Remaining", "A-Ratelimit-Reset")
			}},
		{name: "TestServiceWithDefaultRatelimitHeaders", files: different, minute: true, env: map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true"},
			check: func(c *chk) {
				overFooBar(c)
				r := c.expect(req(dd, []string{"foo", "bar"}, []string{"hello", "world"}), codeOver, st{code: codeOver, limit: m10}, st{code: codeOK})
				c.headers(r, "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset")
			}},
		{name: "TestEmptyDomain", files: different, check: func(c *chk) {
			c.refusedRequest(req("", []string{"hello", "world"}), "rate limit domain must not be empty", regexp.MustCompile(`\bdomain\b`))
		}},
		{name: "TestEmptyDescriptors", files: different, check: func(c *chk) {
			c.refusedRequest(req("test-domain"), "rate limit descriptor list must not be empty", regexp.MustCompile(`\bdescriptors?\b`))
		}},
		{name: "TestCacheError", files: different, ownRedis: true,
			check: func(c *chk) {
				c.redis.stop()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if resp, err := c.p.rl.ShouldRateLimit(ctx, req(dd, []string{"foo", "bar"})); err == nil {
					c.errorf("with Redis down: answered %v, want an error", resp)
				}
			},
			// The default failure policy (local) decides on this replica
			// alone: the first request of the limit is OK, 9 remaining,
			// and the log says the failure policy decided.
			differs: []string{"Redis down: a decision, not an error."}, sgCheck: func(c *chk, up bool) {
				if !up {
					c.errorf("slidegate exited: %s", lastLine(c.p.out.String()))
					return
				}
				c.redis.stop()
				c.expect(req(dd, []string{"foo", "bar"}), codeOK, st{code: codeOK, limit: m10, rem: 9})
				c.eventually("the log line", "logged", func() string {
					out := c.p.out.String()
					if strings.Contains(out, "redisstore: the failure policy decided without Redis") && strings.Contains(out, "failure_policy=local") {
						return "logged"
					}
					return "not logged"
				})
			}},
		{name: "TestInitialLoadError", files: map[string]string{"bad.yaml": "domain: test-domain\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"},
			check: func(c *chk) {
				c.refusedRequest(req("test-domain", []string{"hello", "world"}), "no rate limit configuration loaded", regexp.MustCompile(`no rate limit configuration loaded`))
			},
			// slidegate stops the start: exit 1, naming the file, the line
			// and the fault.
			differs: []string{"A configuration refused at start stops the start."}, sgCheck: func(c *chk, up bool) {
				c.exited(up, 1, regexp.MustCompile(`bad\.yaml:4: unknown unit "fortnight"`))
			}},
		{name: "TestUnlimited", minute: true, files: map[string]string{"some.yaml": "domain: some-domain\ndescriptors:\n  - key: foo\n    value: bar\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: baz\n    value: qux\n    rate_limit: {unlimited: true}\n"},
			check: func(c *chk) {
				c.expect(req("some-domain", []string{"foo", "bar"}, []string{"hello", "world"}, []string{"baz", "qux"}), codeOK,
					st{code: codeOK, limit: m10u, rem: 9}, st{code: codeOK}, st{code: codeOK, rem: math.MaxUint32})
			}},
		{name: "TestServiceHealthStatus", files: different, check: func(c *chk) {
			if got := c.grpcHealth("ratelimit"); got != "SERVING" {
				c.errorf("grpc.health.v1 Check(\"ratelimit\"): want SERVING, got %s", got)
			}
		}},
		{name: "TestServiceHealthStatusAtLeastOneConfigLoaded", env: map[string]string{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true"},
			check: func(c *chk) {
				h := func() string { return c.grpcHealth("ratelimit") }
				if got := h(); got != "NOT_SERVING" {
					c.errorf("before any configuration: want NOT_SERVING, got %s", got)
				}
				p := filepath.Join(c.dir, "different.yaml")
				if err := os.WriteFile(p, []byte(different["different.yaml"]), 0o644); err != nil {
					c.errorf("%v", err)
				}
				c.eventually("once a configuration is loaded", "SERVING", h)
				// A reload to a configuration of no domain.
				if err := os.Remove(p); err != nil {
					c.errorf("%v", err)
				}
				c.eventually("once the configuration has no domain", "NOT_SERVING", h)
			}},
		{name: "TestServiceGlobalQuotaMode", files: quota("foo", 10, false, "hello", 5, false), minute: true, env: map[string]string{"QUOTA_MODE": "true"},
			check: func(c *chk) {
				c.exhaust(qd, []string{"foo", "limit"}, 10)
				c.exhaust(qd, []string{"hello", "limit"}, 5)
				c.expect(req(qd, []string{"foo", "limit"}, []string{"hello", "limit"}), codeOK, st{code: codeOK, limit: m10u}, st{code: codeOK, limit: m5})
			}},
		{name: "TestServiceQuotaModeWithMetadata", files: quota("regular", 10, false, "quota", 5, true), minute: true,
			env: map[string]string{"QUOTA_MODE": "true", "RESPONSE_DYNAMIC_METADATA": "true"}, check: func(c *chk) {
				c.exhaust(qd, []string{"quota", "limit"}, 5)
				r := c.expect(req(qd, []string{"regular", "limit"}, []string{"quota", "limit"}), codeOK, st{code: codeOK, limit: m10u, anyRem: true}, st{code: codeOK, limit: m5})
				if r == nil {
					return
				}
				md := r.DynamicMetadata.GetFields()
				v := md["quotaModeViolations"].GetListValue().GetValues()
				if len(v) != 1 || v[0].GetNumberValue() != 1 {
					c.errorf("dynamic metadata quotaModeViolations %v, want [1]", md["quotaModeViolations"])
				}
				if !md["quotaModeEnabled"].GetBoolValue() {
					c.errorf("dynamic metadata quotaModeEnabled %v, want true", md["quotaModeEnabled"])
				}
			}},
		{name: "TestServicePerDescriptorQuotaMode", files: quota("regular", 5, false, "quota", 3, true), minute: true, check: func(c *chk) {
			c.exhaust(qd, []string{"regular", "limit"}, 5)
			c.exhaust(qd, []string{"quota", "limit"}, 3)
			c.expect(req(qd, []string{"regular", "limit"}, []string{"quota", "limit"}), codeOver, st{code: codeOver, limit: m5}, st{code: codeOK, limit: m3})
		}},
		{name: "TestServiceQuotaModeOnly", files: quota("quota1", 5, true, "quota2", 3, true), minute: true, check: func(c *chk) {
			c.exhaust(qd, []string{"quota1", "limit"}, 5)
			c.exhaust(qd, []string{"quota2", "limit"}, 3)
			c.expect(req(qd, []string{"quota1", "limit"}, []string{"quota2", "limit"}), codeOK, st{code: codeOK, limit: m5}, st{code: codeOK, limit: m3})
		}},
		{name: "TestServiceQuotaModeWithShadowMode", files: quota("regular", 5, false, "quota", 3, true), minute: true, env: map[string]string{"SHADOW_MODE": "true"},
			check: func(c *chk) {
				c.exhaust(qd, []string{"regular", "limit"}, 5)
				c.exhaust(qd, []string{"quota", "limit"}, 3)
				c.expect(req(qd, []string{"regular", "limit"}, []string{"quota", "limit"}), codeOK, st{code: codeOver, limit: m5}, st{code: codeOK, limit: m3})
			}},
	}
	cases = append(cases, tracerCase(t, different))
	runSuite(t, "test/service", cases)
}
