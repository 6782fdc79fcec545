package envoy

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidegate/slidegate/internal/rls"
)

// A step is one ShouldRateLimit request, sent to both services.
type step struct {
	domain string
	descs  []desc
	hits   uint32
}

// desc is one request descriptor: key, value pairs and an optional
// descriptor-level hits_addend.
type desc struct {
	kv    []string
	hits  *uint64
	limit *ratelimitv3.RateLimitDescriptor_RateLimitOverride
}

// dl is a descriptor with a limit override of n per unit.
func dl(n uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, kv ...string) desc {
	return desc{kv: kv, limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: typev3.RateLimitUnit(unit)}}
}

func d(kv ...string) desc { return desc{kv: kv} }

func dh(hits uint64, kv ...string) desc { return desc{kv: kv, hits: &hits} }

func (s step) request() *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: s.domain, HitsAddend: s.hits}
	for _, x := range s.descs {
		rd := &ratelimitv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(x.kv); i += 2 {
			rd.Entries = append(rd.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: x.kv[i], Value: x.kv[i+1]})
		}
		if x.hits != nil {
			rd.HitsAddend = wrapperspb.UInt64(*x.hits)
		}
		rd.Limit = x.limit
		req.Descriptors = append(req.Descriptors, rd)
	}
	return req
}

// times repeats a step n times.
func times(n int, s step) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// scenario is one configuration and the steps sent against it.
type scenario struct {
	name  string
	files map[string]string // relative to the config directory
	env   map[string]string // the peer's; slidegate gets the same settings as options
	steps []step
	// reload, when set, is copied into the configuration directory after
	// steps; once both services answer probe with a limit, after is sent.
	reload map[string]string
	probe  step
	after  []step
	// unload, when set, is sent after every file was removed from the
	// directory and both services answer probe without a limit.
	unload []step
}

// The rows of docs/envoy.md's table of differences on purpose.
const (
	rowWindow   = "sliding window instead of fixed"
	rowAll      = "all or nothing"
	rowRefusals = "refusals never counted"
	rowRepeated = "a repeated descriptor counted once"
)

// tally counts steps over every scenario.
type tally struct {
	steps, equal int
	rows         map[string]int
}

// Units' fixed-window lengths in seconds, as the peer divides time.
var unitSeconds = map[rlsv3.RateLimitResponse_RateLimit_Unit]int64{
	rlsv3.RateLimitResponse_RateLimit_SECOND: 1, rlsv3.RateLimitResponse_RateLimit_MINUTE: 60,
	rlsv3.RateLimitResponse_RateLimit_HOUR: 3600, rlsv3.RateLimitResponse_RateLimit_DAY: 86400,
	rlsv3.RateLimitResponse_RateLimit_WEEK: 7 * 86400, rlsv3.RateLimitResponse_RateLimit_MONTH: 30 * 86400,
	rlsv3.RateLimitResponse_RateLimit_YEAR: 365 * 86400,
}

// descKey identifies a descriptor's counter (the peer keys it by the
// domain and the entries).
func descKey(domain string, x desc) string { return domain + "\x00" + strings.Join(x.kv, "\x00") }

// run sends the scenario's steps to both services and compares every
// answer: equal, or a difference that one row of the table explains.
func run(t *testing.T, e env, sc scenario, store string, tl *tally) {
	t.Helper()
	root, dir := writeRuntime(t, sc.files)
	var opts []rls.Option
	if sc.env["LIMIT_RESPONSE_HEADERS_ENABLED"] == "true" {
		opts = append(opts, rls.WithRateLimitHeaders(sc.env["LIMIT_LIMIT_HEADER"], sc.env["LIMIT_REMAINING_HEADER"], sc.env["LIMIT_RESET_HEADER"]))
	}
	if sc.env["RESPONSE_DYNAMIC_METADATA"] == "true" {
		opts = append(opts, rls.WithDynamicMetadata(true))
	}
	opts = append(opts, rls.WithShadowMode(sc.env["SHADOW_MODE"] == "true"), rls.WithQuotaMode(sc.env["QUOTA_MODE"] == "true"))
	p := startPeer(t, e, root, sc.env)
	s := startSlidegate(t, dir, sc.env["MERGE_DOMAIN_CONFIG"] == "true", store, opts...)
	// Start early in a minute, so that minute limits see one fixed window.
	if sec := time.Now().Unix() % 60; sec >= 50 {
		time.Sleep(time.Duration(61-sec) * time.Second)
	}
	t0 := time.Now().Unix()
	taint := map[string]string{} // descriptor key → the row that made the counts differ
	send(t, p, s, sc, sc.steps, taint, t0, tl)
	if sc.reload == nil {
		return
	}
	for name, body := range sc.reload {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		limited := 0
		for _, c := range []rlsv3.RateLimitServiceClient{p.client, s.client} {
			r, err := c.ShouldRateLimit(context.Background(), sc.probe.request())
			if err == nil && r.Statuses[0].CurrentLimit != nil {
				limited++
			}
		}
		if limited == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the copied file was not in force in both within 60 s", sc.name)
		}
		time.Sleep(50 * time.Millisecond)
	}
	send(t, p, s, sc, sc.after, taint, t0, tl)
	if sc.unload == nil {
		return
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range ents {
		if err := os.RemoveAll(filepath.Join(dir, en.Name())); err != nil {
			t.Fatal(err)
		}
	}
	deadline = time.Now().Add(60 * time.Second)
	for {
		unlimited := 0
		for _, c := range []rlsv3.RateLimitServiceClient{p.client, s.client} {
			r, err := c.ShouldRateLimit(context.Background(), sc.probe.request())
			if err == nil && r.Statuses[0].CurrentLimit == nil {
				unlimited++
			}
		}
		if unlimited == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the rules were not unloaded in both within 60 s", sc.name)
		}
		time.Sleep(50 * time.Millisecond)
	}
	send(t, p, s, sc, sc.unload, taint, t0, tl)
}

// refusedBy reports whether a response refused the request, or would
// have: OVER_LIMIT overall, a descriptor OVER_LIMIT (SHADOW_MODE answers
// OK over such), or a quota violation.
func refusedBy(r *rlsv3.RateLimitResponse) bool {
	if r.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT || r.DynamicMetadata.GetFields()["quotaModeViolations"] != nil {
		return true
	}
	for _, st := range r.Statuses {
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			return true
		}
	}
	return false
}

// send sends steps to both services and compares the answers.
func send(t *testing.T, p *peer, s *sg, sc scenario, steps []step, taint map[string]string, t0 int64, tl *tally) {
	t.Helper()
	for i, st := range steps {
		req := st.request()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		pr, perr := p.client.ShouldRateLimit(ctx, req)
		sr, serr := s.client.ShouldRateLimit(ctx, req)
		cancel()
		t1 := time.Now().Unix()
		tl.steps++
		where := fmt.Sprintf("%s step %d (%s)", sc.name, i, stepString(st))
		if perr != nil || serr != nil {
			if status.Code(perr) == 0 || status.Code(serr) == 0 {
				t.Errorf("%s: peer error %v, slidegate error %v", where, perr, serr)
			} else {
				tl.equal++ // both refuse the message (no domain, no descriptors)
			}
			continue
		}
		// Repeated descriptors: the peer counts each occurrence.
		seen := map[string]bool{}
		for _, x := range st.descs {
			k := descKey(st.domain, x)
			if seen[k] {
				taint[k] = rowRepeated
			}
			seen[k] = true
		}
		diffs := compare(pr, sr)
		if len(diffs) == 0 {
			tl.equal++
		} else if row, bad := explain(st, pr, sr, diffs, taint, t0, t1); bad != "" {
			t.Errorf("%s: %s\n  peer:      %v\n  slidegate: %v", where, bad, pr, sr)
		} else {
			tl.rows[row]++
		}
		// A refused request: the peer charged every descriptor anyway.
		if refusedBy(pr) || refusedBy(sr) {
			for j, x := range st.descs {
				if pr.Statuses[j].GetCurrentLimit() == nil {
					continue
				}
				k := descKey(st.domain, x)
				if taint[k] != "" {
					continue
				}
				if pr.Statuses[j].Code == rlsv3.RateLimitResponse_OVER_LIMIT || sr.Statuses[j].Code == rlsv3.RateLimitResponse_OVER_LIMIT {
					taint[k] = rowRefusals
				} else {
					taint[k] = rowAll
				}
			}
		}
		// A shared (share_threshold) or replaced counter spans several
		// descriptors: a scenario marks them by taking the row over for
		// the whole domain when one of them is tainted.
		if sc.env["slidegate-shared"] != "" {
			for _, r := range taint {
				for _, x := range st.descs {
					if taint[descKey(st.domain, x)] == "" {
						taint[descKey(st.domain, x)] = r
					}
				}
			}
		}
	}
}

// explain returns the table row that explains every difference of a
// step, or what no row explains.
func explain(st step, pr, sr *rlsv3.RateLimitResponse, diffs []diff, taint map[string]string, t0, t1 int64) (row, bad string) {
	refused := refusedBy(pr) || refusedBy(sr)
	rows := make([]string, len(diffs))
	for i, di := range diffs {
		if di.index < 0 {
			continue
		}
		rows[i] = taint[descKey(st.domain, st.descs[di.index])]
		if pl := pr.Statuses[di.index].GetCurrentLimit(); pl != nil && t1/unitSeconds[pl.Unit] != t0/unitSeconds[pl.Unit] {
			rows[i] = rowWindow
		}
	}
	for _, r := range rows {
		if r != "" {
			row = r
		}
	}
	for i, di := range diffs {
		if rows[i] != "" {
			continue
		}
		switch {
		case di.index < 0 && row != "":
			// The response follows from its descriptors.
			rows[i] = row
		case di.index >= 0 && refused && di.remainingOnly:
			// The peer charges a refused request's descriptors that fit:
			// this step already shows it.
			rows[i] = rowAll
			row = cmp.Or(row, rowAll)
		default:
			return "", di.what
		}
	}
	for i, di := range diffs {
		if di.index < 0 && rows[i] == "" {
			if row == "" {
				return "", di.what
			}
		}
	}
	return row, ""
}

type diff struct {
	remainingOnly bool // a status with equal codes and limits, only its remaining differs
	index         int  // the descriptor, or -1 for the response
	what          string
}

// compare lists where two responses differ in what the peer defines:
// the overall code, each status's code, limit and remaining, whether it
// has a reset, the headers (but the reset's value) and dynamic metadata.
func compare(p, s *rlsv3.RateLimitResponse) []diff {
	var out []diff
	if p.OverallCode != s.OverallCode {
		out = append(out, diff{index: -1, what: fmt.Sprintf("overall %v, slidegate %v", p.OverallCode, s.OverallCode)})
	}
	if len(p.Statuses) != len(s.Statuses) {
		return append(out, diff{index: -1, what: "number of statuses"})
	}
	for i := range p.Statuses {
		a, b := p.Statuses[i], s.Statuses[i]
		switch {
		case a.Code != b.Code:
			out = append(out, diff{index: i, what: fmt.Sprintf("status %d code %v, slidegate %v", i, a.Code, b.Code)})
		case !proto.Equal(a.CurrentLimit, b.CurrentLimit):
			out = append(out, diff{index: i, what: fmt.Sprintf("status %d limit %v, slidegate %v", i, a.CurrentLimit, b.CurrentLimit)})
		case a.LimitRemaining != b.LimitRemaining:
			out = append(out, diff{index: i, remainingOnly: a.Code == rlsv3.RateLimitResponse_OK, what: fmt.Sprintf("status %d remaining %d, slidegate %d", i, a.LimitRemaining, b.LimitRemaining)})
		case (a.DurationUntilReset == nil) != (b.DurationUntilReset == nil):
			out = append(out, diff{index: i, what: fmt.Sprintf("status %d reset %v, slidegate %v", i, a.DurationUntilReset, b.DurationUntilReset)})
		}
	}
	ph, sh := headers(p), headers(s)
	if !slices.Equal(ph, sh) {
		out = append(out, diff{index: -1, what: fmt.Sprintf("headers %q, slidegate %q", ph, sh)})
	}
	if !proto.Equal(stripLimits(p.DynamicMetadata), stripLimits(s.DynamicMetadata)) {
		out = append(out, diff{index: -1, what: fmt.Sprintf("dynamic metadata %v, slidegate %v", p.DynamicMetadata, s.DynamicMetadata)})
	}
	return out
}

// headers lists name=value, with the reset header's value left out (a
// fixed window's reset against a sliding one's).
func headers(r *rlsv3.RateLimitResponse) []string {
	var out []string
	for _, h := range r.ResponseHeadersToAdd {
		v := h.Value
		if strings.HasSuffix(strings.ToLower(h.Key), "reset") {
			v = "…"
		}
		out = append(out, h.Key+"="+v)
	}
	sort.Strings(out)
	return out
}

// stripLimits drops the descriptors' "limit" strings: protobuf's text
// format, which is deliberately unstable between builds.
func stripLimits(m *structpb.Struct) *structpb.Struct {
	if m == nil {
		return nil
	}
	m = proto.Clone(m).(*structpb.Struct)
	for _, v := range m.GetFields()["descriptors"].GetListValue().GetValues() {
		delete(v.GetStructValue().GetFields(), "limit")
	}
	return m
}

func stepString(s step) string {
	var b strings.Builder
	b.WriteString(s.domain)
	for _, x := range s.descs {
		b.WriteString(" [")
		for i := 0; i+1 < len(x.kv); i += 2 {
			if i > 0 {
				b.WriteString(",")
			}
			v := x.kv[i+1]
			if len(v) > 20 {
				v = fmt.Sprintf("%.12s…(%d bytes)", v, len(v))
			}
			b.WriteString(x.kv[i] + "=" + v)
		}
		if x.hits != nil {
			fmt.Fprintf(&b, " hits=%d", *x.hits)
		}
		if x.limit != nil {
			fmt.Fprintf(&b, " limit=%d/%v", x.limit.RequestsPerUnit, x.limit.Unit)
		}
		b.WriteString("]")
	}
	if s.hits != 0 {
		fmt.Fprintf(&b, " hits_addend=%d", s.hits)
	}
	return b.String()
}

func peerFile(t *testing.T, e env, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.src, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The same requests to envoyproxy/ratelimit and to slidegate: every
// answer is equal or a row of docs/envoy.md's table.
func TestDifferential(t *testing.T) {
	e := needEnv(t)
	tl := &tally{rows: map[string]int{}}
	for _, sc := range scenarios(t, e) {
		t.Run(sc.name, func(t *testing.T) { run(t, e, sc, "", tl) })
	}
	tl.log(t, "memory store")
}

// The same on slidegate's Redis store (its own database beside the
// peer's): descriptors of different costs in one request and limit
// overrides included (one script call, each descriptor charged its own
// cost under its own limit), and the 2^32-1 per hour rule on the Redis
// counter.
func TestDifferentialRedis(t *testing.T) {
	e := needEnv(t)
	tl := &tally{rows: map[string]int{}}
	for _, sc := range scenarios(t, e) {
		t.Run(sc.name, func(t *testing.T) { run(t, e, sc, "redis://"+e.redis+"/1", tl) })
	}
	tl.log(t, "Redis store")
}

func (tl *tally) log(t *testing.T, what string) {
	var rows []string
	for r, n := range tl.rows {
		rows = append(rows, fmt.Sprintf("%s: %d", r, n))
	}
	sort.Strings(rows)
	t.Logf("differential, %s: %d steps, %d equal, %d table rows (%s)", what, tl.steps, tl.equal, tl.steps-tl.equal, strings.Join(rows, "; "))
	if tl.steps < 200 {
		t.Errorf("only %d steps ran", tl.steps)
	}
}

func scenarios(t *testing.T, e env) []scenario {
	integ := map[string]string{}
	for _, f := range []string{"basic.yaml", "another.yaml", "share_threshold.yaml"} {
		integ[f] = peerFile(t, e, "test/integration/runtime/current/ratelimit/config/"+f)
	}
	example := map[string]string{"config.yaml": peerFile(t, e, "examples/ratelimit/config/config.yaml"),
		"example.yaml": peerFile(t, e, "examples/ratelimit/config/example.yaml")}
	exampleRL := map[string]string{"example.yaml": peerFile(t, e, "examples/ratelimit/config/example.yaml")}
	var out []scenario

	// The peer's integration test (testBasicBaseConfig, testShareThreshold).
	basic := []step{{domain: "foo", descs: []desc{d("hello", "world")}}, {domain: "basic", descs: []desc{d("key1", "foo")}}}
	basic = append(basic, times(25, step{domain: "another", descs: []desc{d("key2", "7")}})...)
	basic = append(basic, times(15, step{domain: "another", descs: []desc{d("key2", "8"), d("key3", "8")}})...)
	basic = append(basic, times(2, step{domain: "another", descs: []desc{d("key4", "durTest")}})...)
	out = append(out, scenario{name: "integration-basic", files: integ, steps: basic})
	share := times(10, step{domain: "share-threshold-test", descs: []desc{d("files", "files/a.pdf")}})
	share = append(share, step{domain: "share-threshold-test", descs: []desc{d("files", "files/b.csv")}})
	for i := range 10 {
		share = append(share, step{domain: "share-threshold-test", descs: []desc{d("files_no_share", fmt.Sprintf("files_no_share/%d", i))}})
	}
	out = append(out, scenario{name: "integration-share-threshold", files: integ, steps: share, env: map[string]string{"slidegate-shared": "1"}})
	reload := map[string]string{"reload.yaml": peerFile(t, e, "test/integration/runtime/current/ratelimit/reload.yaml")}
	out = append(out, scenario{name: "integration-reload-config", files: reload, steps: append(
		times(3, step{domain: "reload", descs: []desc{d("block", "foo")}}),
		times(3, step{domain: "reload", descs: []desc{d("one_per_minute", "a"), d("key1", "x")}})...)})
	// The peer's reload scenario (testConfigReload): a file copied into the
	// watched directory is put in force; unchanged rules keep their counts.
	out = append(out, scenario{name: "integration-reload", files: integ,
		steps:  times(2, step{domain: "basic", descs: []desc{d("one_per_minute", "r")}}),
		reload: reload, probe: step{domain: "reload", descs: []desc{dh(0, "key1", "probe")}},
		after: append(append(times(2, step{domain: "basic", descs: []desc{d("one_per_minute", "r")}}),
			times(2, step{domain: "reload", descs: []desc{d("one_per_minute", "r")}})...),
			times(2, step{domain: "reload", descs: []desc{d("block", "b")}})...)})

	// The peer's integration-test scripts, with the descriptors its Envoy
	// example (examples/envoy/proxy.yaml) sends for their headers.
	twoheader := func(foo, bar, baz string) step {
		s := step{domain: "rl"}
		if bar != "" {
			s.descs = append(s.descs, d("foo", foo, "bar", bar))
		}
		if baz != "" {
			s.descs = append(s.descs, d("foo", foo, "baz", baz))
		}
		return s
	}
	fourheader := func(foo, bar, src, dst string) step {
		return step{domain: "rl", descs: []desc{d("foo", foo, "bar", bar), d("source_cluster", src, "destination_cluster", dst)}}
	}
	scripts := []step{twoheader("test", "", "shady")}                              // simple-get
	scripts = append(scripts, times(5, twoheader("pelle", "", "not-so-shady"))...) // trigger-ratelimit
	scripts = append(scripts, times(6, twoheader("pelle", "", "shady"))...)        // trigger-shadow-mode-key
	scripts = append(scripts, times(3, step{domain: "rl", descs: []desc{d("unspec", "unspecified_value")}})...)
	scripts = append(scripts, twoheader("bkthomps", "banned", ""), fourheader("bkthomps", "banned", "proxy", "mock")) // replaces
	scripts = append(scripts, times(3, fourheader("bkthomps", "banned", "proxy", "override"))...)
	out = append(out, scenario{name: "integration-scripts", files: exampleRL, steps: scripts,
		env: map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_REMAINING_HEADER": "x-ratelimit-remaining"}})

	// The example configurations, every domain.
	ex := []step{}
	ex = append(ex, times(3, step{domain: "mongo_cps", descs: []desc{d("database", "users")}})...)
	ex = append(ex, step{domain: "mongo_cps", descs: []desc{d("database", "other")}})
	ex = append(ex, times(4, step{domain: "rl", descs: []desc{d("category", "account"), d("foo", "x", "bar", "bkthomps")}})...)
	ex = append(ex, times(3, step{domain: "rl", descs: []desc{d("source_cluster", "proxy", "destination_cluster", "bkthomps"), d("foo", "y", "bar", "bkthomps")}})...)
	ex = append(ex, times(3, step{domain: "rl", descs: []desc{d("source_cluster", "proxy", "destination_cluster", "fake"), d("category", "account")}})...)
	ex = append(ex, times(4, step{domain: "rl", descs: []desc{d("foo", "z")}})...)
	ex = append(ex, times(4, step{domain: "rl", descs: []desc{d("foo", "z", "bar", "any")}})...)
	ex = append(ex, times(3, step{domain: "rl", descs: []desc{d("foo", "z", "bay", "q"), d("qux", "1")}})...)
	ex = append(ex, times(3, step{domain: "rl", descs: []desc{d("unspec", "u1")}})...)
	ex = append(ex, step{domain: "rl", descs: []desc{d("foo", "z", "bar", "banned")}})
	ex = append(ex, step{domain: "rl", descs: []desc{d("nothing", "here")}})
	out = append(out, scenario{name: "examples", files: example, steps: ex,
		env: map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "RESPONSE_DYNAMIC_METADATA": "true"}})
	// The peer's global modes over the same requests: SHADOW_MODE answers
	// OK over descriptors OVER_LIMIT, QUOTA_MODE reports every refusal as
	// a quota violation.
	out = append(out, scenario{name: "global-shadow-mode", files: example, steps: ex,
		env: map[string]string{"SHADOW_MODE": "true", "RESPONSE_DYNAMIC_METADATA": "true"}})
	out = append(out, scenario{name: "global-quota-mode", files: example, steps: ex,
		env: map[string]string{"QUOTA_MODE": "true", "RESPONSE_DYNAMIC_METADATA": "true"}})
	// An empty runtime directory: both start and answer with no limit; a
	// file copied in is enforced; the directory emptied unloads it.
	oneMin := times(3, step{domain: "basic", descs: []desc{d("one_per_minute", "e")}})
	out = append(out, scenario{name: "empty-directory", files: map[string]string{}, steps: oneMin,
		reload: map[string]string{"basic.yaml": integ["basic.yaml"]}, probe: step{domain: "basic", descs: []desc{dh(0, "one_per_minute", "probe")}},
		after: oneMin, unload: oneMin})

	// The peer's test/config fixtures that load.
	wild := peerFile(t, e, "test/config/wildcard.yaml")
	w := []step{}
	for _, v := range []string{"foo", "foobar", "foo1", "bar", "barfoo", ""} {
		w = append(w, times(2, step{domain: "test-domain", descs: []desc{d("wild", v)}})...)
		w = append(w, step{domain: "test-domain", descs: []desc{d("nestedWild", "val1", "wild", v)}})
	}
	out = append(out, scenario{name: "fixture-wildcard", files: map[string]string{"wildcard.yaml": wild}, steps: w})
	shadow := peerFile(t, e, "test/config/shadowmode_config.yaml")
	sh := []step{}
	for _, kv := range [][]string{{"key1", "value1"}, {"key1", "value1", "subkey1", "x"}, {"key2", "value2"}, {"key3", "x"}, {"key4", "value4"}, {"key5", "x"}} {
		sh = append(sh, times(3, step{domain: "test-domain", descs: []desc{d(kv...)}})...)
	}
	out = append(out, scenario{name: "fixture-shadow", files: map[string]string{"shadow.yaml": shadow}, steps: sh})
	basicCfg := peerFile(t, e, "test/config/basic_config.yaml")
	bc := []step{}
	for _, kv := range [][]string{{"key1", "value1"}, {"key1", "value1", "subkey1", "something"}, {"key1", "value1", "subkey1", "subvalue1"}, {"key2", "x"}, {"key2", "value2"}, {"key2", "value3"}, {"key3", "x"}, {"key4", "x"}, {"key5", "x"}, {"key6", "x"}, {"key7", "x"}, {"key8", "x"}, {"key9", "x"}} {
		bc = append(bc, times(2, step{domain: "test-domain", descs: []desc{d(kv...)}})...)
	}
	out = append(out, scenario{name: "fixture-basic", files: map[string]string{"basic.yaml": basicCfg}, steps: bc})
	merge := map[string]string{"a.yaml": peerFile(t, e, "test/config/merge_domain_key1.yaml"), "b.yaml": peerFile(t, e, "test/config/merge_domain_key2.yaml")}
	out = append(out, scenario{name: "fixture-merge", files: merge, env: map[string]string{"MERGE_DOMAIN_CONFIG": "true"},
		steps: times(3, step{domain: "test-domain", descs: []desc{d("key1", "value1"), d("key2", "value2")}})})

	// The cases.
	cases := `domain: c
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 4294967295}
  - key: q
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: norpu
    rate_limit: {unit: minute}
  - key: s
    shadow_mode: true
  - key: a
    rate_limit: {name: a, unit: minute, requests_per_unit: 3, replaces: [{name: b}]}
  - key: b
    rate_limit: {name: b, unit: minute, requests_per_unit: 3, replaces: [{name: c}]}
  - key: c
    rate_limit: {name: c, unit: minute, requests_per_unit: 3}
  - key: x
    rate_limit: {name: x, unit: minute, requests_per_unit: 3, replaces: [{name: y}]}
  - key: y
    rate_limit: {name: y, unit: minute, requests_per_unit: 3, replaces: [{name: x}]}
  - key: path
    value: /login
    descriptors:
      - key: ip
        rate_limit: {unit: minute, requests_per_unit: 3}
`
	long := strings.Repeat("k", 1100)
	var many []desc
	for i := range 65 {
		many = append(many, d("api_key", fmt.Sprintf("m%d", i)))
	}
	cs := []step{
		{domain: "unknown", descs: []desc{d("ip", "1")}},
		{domain: "c", descs: []desc{d("free", "1")}},
		{domain: "c", descs: []desc{d("big", "1")}},
		{domain: "c", descs: []desc{d("big", "1")}, hits: 1_000_000_000}, // at most 2^30 at once (docs/envoy.md)
		{domain: "c", descs: []desc{d("q", "1")}}, {domain: "c", descs: []desc{d("q", "1")}}, {domain: "c", descs: []desc{d("q", "1"), d("ip", "q")}},
		{domain: "c", descs: []desc{d("norpu", "1")}},
		{domain: "c", descs: []desc{d("s", "1")}},
		{domain: "c", descs: []desc{dh(0, "ip", "h0")}}, {domain: "c", descs: []desc{dh(0, "ip", "h0")}},
		{domain: "c", descs: []desc{dh(1, "ip", "h1"), dh(3, "api_key", "h1")}},
		{domain: "c", descs: []desc{dh(1, "ip", "h1"), dh(2, "api_key", "h1")}},
		{domain: "c", descs: []desc{dh(0, "ip", "h1"), dh(0, "api_key", "h1")}},
		{domain: "c", descs: []desc{d("ip", "h2")}, hits: 2}, {domain: "c", descs: []desc{dh(0, "ip", "h2")}},
		{domain: "c", descs: []desc{{}, d("ip", "e")}},
		{domain: "c", descs: []desc{d("", "v"), d("ip", "e")}},
		{domain: "c", descs: []desc{d("zero", "1"), d("ip", "z")}},
		{domain: "c", descs: []desc{dh(0, "zero", "1"), d("ip", "z2")}},
		{domain: "c", descs: []desc{d("a", "1"), d("b", "1"), d("c", "1")}},
		{domain: "c", descs: []desc{d("c", "1"), d("b", "1"), d("a", "1")}},
		{domain: "c", descs: []desc{d("x", "1"), d("y", "1")}},
		{domain: "c", descs: []desc{d("y", "1"), d("x", "1")}},
		{domain: "c", descs: []desc{d("api_key", long)}}, {domain: "c", descs: []desc{d("api_key", long)}},
		{domain: "c", descs: many},
		{domain: "c", descs: []desc{d("path", "/login", "ip", "p")}},
		{domain: "c", descs: []desc{d("path", "/login", "ip", "p", "extra", "1")}},
		{domain: "c", descs: []desc{d("path", "/login")}},
		{domain: "c", descs: []desc{d("ip", "r"), d("ip", "r")}},
	}
	// Limit overrides, on descriptors no other step counts.
	hour := rlsv3.RateLimitResponse_RateLimit_HOUR
	for range 4 {
		cs = append(cs, step{domain: "c", descs: []desc{dl(3, hour, "ov", "1"), d("api_key", "ov")}})
	}
	cs = append(cs, step{domain: "c", descs: []desc{dl(0, hour, "ip", "ov0")}},
		step{domain: "c", descs: []desc{dl(2, rlsv3.RateLimitResponse_RateLimit_DAY, "ip", "ov2")}},
		step{domain: "c", descs: []desc{dl(2, rlsv3.RateLimitResponse_RateLimit_DAY, "ip", "ov2")}},
		step{domain: "c", descs: []desc{dl(2, rlsv3.RateLimitResponse_RateLimit_DAY, "ip", "ov2")}})
	// The bypass: an address over its limit, with a long api_key value.
	for range 4 {
		cs = append(cs, step{domain: "c", descs: []desc{d("ip", "bypass"), d("api_key", long+"b")}})
	}
	out = append(out, scenario{name: "cases", files: map[string]string{"cases.yaml": cases}, steps: cs,
		env: map[string]string{"RESPONSE_DYNAMIC_METADATA": "true", "LIMIT_RESPONSE_HEADERS_ENABLED": "true"}})

	// Random sequences inside one fixed window.
	random := `domain: r
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 6}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: route
    value: "/a*"
    rate_limit: {unit: hour, requests_per_unit: 9}
  - key: route
    value: /open
    rate_limit: {unlimited: true}
  - key: plan
    value: gold
    rate_limit: {name: gold, unit: minute, requests_per_unit: 8, replaces: [{name: per_ip}]}
  - key: tenant
    descriptors:
      - key: ip
        rate_limit: {name: per_ip, unit: minute, requests_per_unit: 3}
  - key: watch
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: none
    rate_limit: {unit: minute, requests_per_unit: 0}
`
	for seed := range uint64(3) {
		rng := rand.New(rand.NewPCG(seed, 27))
		pick := func() desc {
			v := fmt.Sprint(rng.IntN(3))
			switch rng.IntN(9) {
			case 0:
				return d("user", "u"+v)
			case 1:
				return d("ip", "i"+v)
			case 2:
				return d("route", []string{"/a", "/ab", "/open", "/b"}[rng.IntN(4)])
			case 3:
				return d("plan", []string{"gold", "free"}[rng.IntN(2)])
			case 4:
				return d("tenant", "t"+v, "ip", "i"+v)
			case 5:
				return d("watch", "w"+v)
			case 6:
				if rng.IntN(4) == 0 {
					return d("none", "n")
				}
				return d("user", "u"+v, "ip", "i"+v)
			case 7:
				return dh(uint64(rng.IntN(3)), "user", "u"+v)
			default:
				return d("other", v)
			}
		}
		var rs []step
		for range 80 {
			st := step{domain: "r"}
			for range 1 + rng.IntN(3) {
				st.descs = append(st.descs, pick())
			}
			if rng.IntN(5) == 0 {
				st.hits = uint32(rng.IntN(3))
			}
			rs = append(rs, st)
		}
		out = append(out, scenario{name: fmt.Sprintf("random-%d", seed), files: map[string]string{"random.yaml": random}, steps: rs,
			env: map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true"}})
	}
	return out
}
