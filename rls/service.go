package rls

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/headerfmt"
)

// Bounds on every client-controlled part of a request. A request beyond
// any of them is answered InvalidArgument and charges nothing.
const (
	// MaxDomainLen bounds the domain.
	MaxDomainLen = 256
	// MaxDescriptors bounds the descriptors of one request.
	MaxDescriptors = 64
	// MaxEntries bounds the entries of one descriptor (and the depth of
	// the configuration's trees).
	MaxEntries = 16
	// MaxKeyLen bounds an entry's key (and a configured key or name).
	MaxKeyLen = 256
	// MaxValueLen bounds an entry's value (and a configured value).
	MaxValueLen = 1024
	// MaxHitsAddend bounds hits_addend: no policy admits more at once
	// (engine.MaxCounterLimit). A protobuf uint32 that a client meant as
	// negative arrives as a number above it.
	MaxHitsAddend = engine.MaxCounterLimit
	// DefaultNearLimitRatio is the share of a limit above which an allowed
	// request counts as near the limit (as in envoyproxy/ratelimit).
	DefaultNearLimitRatio = 0.8
)

// Option configures a Service.
type Option func(*options)

type options struct {
	reg     prometheus.Registerer
	headers bool
	near    float64
	tagKey  string
}

// WithRegisterer registers the service's metrics on reg (the server's
// admin registry); without it the service keeps no metrics.
func WithRegisterer(reg prometheus.Registerer) Option { return func(o *options) { o.reg = reg } }

// WithHeaders makes every response that matched a limit carry the IETF
// draft headers of its binding limit, RateLimit-Policy and RateLimit, for
// Envoy to add to the client's response, plus Retry-After on OVER_LIMIT.
func WithHeaders(on bool) Option { return func(o *options) { o.headers = on } }

// WithClusterTag names the descriptor entry key whose value places every
// key of a request together on a backend that keeps keys in partitions
// (an engine.TaggedGroupBackend: Redis Cluster), so that one atomic call
// decides all the request's descriptors. The first entry with that key in
// the request's descriptors is the tag (typically the client's identity:
// "user_id" or "remote_address"); a limit keyed by other values then
// counts per tag value too. Without it, or when a request has no such
// entry, such a backend decides only requests whose limits share one key,
// and answers others InvalidArgument. Other backends ignore it.
func WithClusterTag(entryKey string) Option { return func(o *options) { o.tagKey = entryKey } }

// WithNearLimitRatio sets the share of a limit (0 < ratio < 1) above which
// an allowed request counts in the near-limit metric; the default is
// DefaultNearLimitRatio.
func WithNearLimitRatio(r float64) Option { return func(o *options) { o.near = r } }

// Service is the Envoy rate limit service (envoy.service.ratelimit.v3):
// it decides ShouldRateLimit requests with a configuration in
// envoyproxy/ratelimit's format over any engine.GroupBackend whose
// policies are the configuration's (Config.Policies).
//
// Each of a request's descriptors selects at most one rule (see Config and
// docs/envoy.md for the precedence). The enforced rules the request
// selects are decided together, all or nothing, in one call of the
// backend: the request is charged to every one of them, or, when any one
// refuses, to none. The key a rule counts against is the descriptor's
// entries, so a rule written without a value keeps one log per distinct
// value.
//
// Shadow rules (shadow_mode: true) are decided in a second call, all or
// nothing among themselves, and only when the enforced rules allowed the
// request: a request that Envoy refuses never reaches the upstream, so it
// is not counted against limits that merely watch. A shadow rule that
// would have refused is counted (metrics) and reported OK; it never
// changes the overall code.
//
// A Service is safe for concurrent use. It does not own the backend:
// closing the backend is the caller's business.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	cfg      *Config
	backend  engine.GroupBackend
	domains  map[string]*domainState
	policies []engine.Policy
	headers  bool
	near     float64
	tagKey   string // WithClusterTag
	m        *metrics
	// headerPolicy[i] is the rendered RateLimit-Policy value of policy i,
	// and ratePrefix[i] the start of its RateLimit value.
	headerPolicy []string
	ratePrefix   []string
}

type domainState struct {
	root    *node
	latency prometheus.Observer
}

// New returns a service deciding with cfg over b. b's policies must be
// cfg.Policies(), in order (cfg.NewGroup builds such a backend in memory).
// b may be nil only when cfg has no policies (every rule is unlimited or
// refuses everything).
func New(cfg *Config, b engine.GroupBackend, opts ...Option) (*Service, error) {
	if cfg == nil {
		return nil, errors.New("rls: New needs a configuration")
	}
	if b == nil {
		if len(cfg.policies) > 0 {
			return nil, errors.New("rls: New needs a backend for the configuration's policies")
		}
		b = noPolicies{}
	}
	o := options{near: DefaultNearLimitRatio}
	for _, f := range opts {
		f(&o)
	}
	if !(o.near > 0 && o.near < 1) {
		return nil, fmt.Errorf("rls: near-limit ratio %v is outside (0, 1)", o.near)
	}
	want, got := cfg.policies, b.Policies()
	if len(want) != len(got) {
		return nil, fmt.Errorf("rls: the backend has %d policies, the configuration %d", len(got), len(want))
	}
	for i := range want {
		if want[i].Limit != got[i].Limit || want[i].Window != got[i].Window || want[i].Algorithm != got[i].Algorithm {
			return nil, fmt.Errorf("rls: backend policy %d (%q) differs from the configuration's (%q)", i, got[i].Name, want[i].Name)
		}
	}
	s := &Service{cfg: cfg, backend: b, domains: map[string]*domainState{}, policies: want,
		headers: o.headers, near: o.near, tagKey: o.tagKey}
	m, err := newMetrics(o.reg, cfg, b)
	if err != nil {
		return nil, err
	}
	s.m = m
	for name, root := range cfg.domains {
		s.domains[name] = &domainState{root: root, latency: m.latency.WithLabelValues(name)}
	}
	for _, p := range want {
		q := headerfmt.SFString(p.Name)
		s.headerPolicy = append(s.headerPolicy, q+";q="+strconv.Itoa(p.Limit)+";w="+strconv.FormatInt(headerfmt.CeilSeconds(p.Window), 10))
		s.ratePrefix = append(s.ratePrefix, q+";r=")
	}
	return s, nil
}

// Config returns the configuration the service decides with.
func (s *Service) Config() *Config { return s.cfg }

// noPolicies is the backend of a configuration without policies: the
// service never asks it to decide.
type noPolicies struct{}

func (noPolicies) Policies() []engine.Policy { return nil }
func (noPolicies) DecideRefs(context.Context, []engine.Decision, []engine.Ref, int) (engine.GroupDecision, error) {
	return engine.GroupDecision{}, fmt.Errorf("%w: the configuration has no policies", engine.ErrInvalidKeys)
}
func (noPolicies) WallTime(int64) time.Time { return time.Time{} }
func (noPolicies) Close() error             { return nil }

// descriptor is one request descriptor during a decision.
type descriptor struct {
	rule    *Rule
	key     string
	cost    int
	never   bool // the limit can never admit the cost (limit 0, or cost above it)
	decided bool
	d       engine.Decision
}

// badRequest answers InvalidArgument; the message quotes no more than the
// bounded fields of the request.
func badRequest(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "rls: "+format, args...)
}

// ShouldRateLimit decides a request. Bad requests are answered with
// InvalidArgument (NotFound for an unknown domain) and charge nothing; a
// backend failure is Unavailable.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	resp, err := s.decide(ctx, req, start)
	if err != nil {
		s.m.fail(status.Code(err))
	}
	return resp, err
}

func (s *Service) decide(ctx context.Context, req *rlsv3.RateLimitRequest, start time.Time) (*rlsv3.RateLimitResponse, error) {
	domain := req.GetDomain()
	switch {
	case domain == "":
		return nil, badRequest("empty domain")
	case len(domain) > MaxDomainLen:
		return nil, badRequest("domain longer than %d bytes", MaxDomainLen)
	}
	ds := s.domains[domain]
	if ds == nil {
		return nil, status.Errorf(codes.NotFound, "rls: unknown domain %q", domain)
	}
	in := req.GetDescriptors()
	switch {
	case len(in) == 0:
		return nil, badRequest("no descriptors")
	case len(in) > MaxDescriptors:
		return nil, badRequest("%d descriptors; at most %d", len(in), MaxDescriptors)
	}
	if req.GetHitsAddend() > MaxHitsAddend {
		return nil, badRequest("hits_addend %d exceeds %d", req.GetHitsAddend(), MaxHitsAddend)
	}
	cost := max(int(req.GetHitsAddend()), 1)

	var dbuf [8]descriptor
	descs := dbuf[:0]
	if len(in) > len(dbuf) {
		descs = make([]descriptor, 0, len(in))
	}
	var ebuf [MaxEntries]entry
	var kb strings.Builder
	for i, d := range in {
		es := d.GetEntries()
		switch {
		case len(es) == 0:
			return nil, badRequest("descriptor %d has no entries", i)
		case len(es) > MaxEntries:
			return nil, badRequest("descriptor %d has %d entries; at most %d", i, len(es), MaxEntries)
		case d.GetLimit() != nil:
			return nil, status.Errorf(codes.Unimplemented, "rls: descriptor %d: limit overrides are not supported; configure the limit in the service", i)
		case d.GetIsNegativeHits():
			return nil, status.Errorf(codes.Unimplemented, "rls: descriptor %d: negative hits are not supported (a sliding log cannot give back requests)", i)
		}
		dcost := cost
		if h := d.GetHitsAddend(); h != nil {
			if h.GetValue() > MaxHitsAddend {
				return nil, badRequest("descriptor %d: hits_addend %d exceeds %d", i, h.GetValue(), MaxHitsAddend)
			}
			dcost = max(int(h.GetValue()), 1)
		}
		entries := ebuf[:0]
		kb.Reset()
		for j, e := range es {
			k, v := e.GetKey(), e.GetValue()
			switch {
			case k == "":
				return nil, badRequest("descriptor %d entry %d has an empty key", i, j)
			case len(k) > MaxKeyLen:
				return nil, badRequest("descriptor %d entry %d: key longer than %d bytes", i, j, MaxKeyLen)
			case len(v) > MaxValueLen:
				return nil, badRequest("descriptor %d entry %d: value longer than %d bytes", i, j, MaxValueLen)
			}
			entries = append(entries, entry{k, v})
		}
		r := match(ds.root, entries)
		dd := descriptor{rule: r, cost: dcost}
		if r != nil && r.Policy >= 0 {
			// The key of the rule's log: the entries, length-prefixed so
			// that no two distinct entry lists share a key.
			for _, e := range entries {
				kb.WriteString(strconv.Itoa(len(e.key)))
				kb.WriteByte(':')
				kb.WriteString(e.key)
				kb.WriteString(strconv.Itoa(len(e.value)))
				kb.WriteByte(':')
				kb.WriteString(e.value)
			}
			dd.key = kb.String()
		}
		descs = append(descs, dd)
	}
	// replaces: a matched rule named by another matched rule's replaces
	// list does not apply.
	for i := range descs {
		r := descs[i].rule
		if r == nil || r.Name == "" {
			continue
		}
		for j := range descs {
			if o := descs[j].rule; j != i && o != nil && o.Name != r.Name && contains(o.Replaces, r.Name) {
				descs[i].rule = nil
				break
			}
		}
	}
	// One cost per request: the group decides all or nothing at one cost.
	n := 0
	for i := range descs {
		d := &descs[i]
		if d.rule == nil || d.rule.Unlimited {
			continue
		}
		if n == 0 {
			n = d.cost
		} else if d.cost != n {
			return nil, badRequest("descriptors with limits have different hits_addend (%d and %d); one request is decided at one cost", n, d.cost)
		}
		d.never = d.rule.Limit == 0 || d.cost > d.rule.Limit
	}

	tag := s.tagOf(in)
	over, err := s.decideRefs(ctx, descs, n, false, tag)
	if err != nil {
		return nil, err
	}
	if !over {
		if _, err := s.decideRefs(ctx, descs, n, true, tag); err != nil {
			return nil, err
		}
	}
	ds.latency.Observe(time.Since(start).Seconds())
	return s.respond(descs, over), nil
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// tagOf returns the value of the first entry of in whose key is the
// configured cluster tag key, or "" (see WithClusterTag).
func (s *Service) tagOf(in []*ratelimitv3.RateLimitDescriptor) string {
	if s.tagKey == "" {
		return ""
	}
	for _, d := range in {
		for _, e := range d.GetEntries() {
			if e.GetKey() == s.tagKey {
				return e.GetValue()
			}
		}
	}
	return ""
}

// decideRefs decides the descriptors whose rules are shadow == shadow, all
// or nothing, and reports whether they refused. A rule that can never
// admit the cost refuses without asking the backend (nothing is charged).
// A non-empty tag places the keys of a partitioned backend together.
func (s *Service) decideRefs(ctx context.Context, descs []descriptor, n int, shadow bool, tag string) (bool, error) {
	var rbuf [8]engine.Ref
	var idx [8]int
	refs, at := rbuf[:0], idx[:0]
	never := false
	for i := range descs {
		d := &descs[i]
		if d.rule == nil || d.rule.Unlimited || d.rule.Shadow != shadow {
			continue
		}
		if d.never {
			never = true
			continue
		}
		refs = append(refs, engine.Ref{Policy: d.rule.Policy, Key: d.key})
		at = append(at, i)
	}
	if never {
		return true, nil
	}
	if len(refs) == 0 {
		return false, nil
	}
	var dbuf [8]engine.Decision
	gd, err := engine.DecideTagged(ctx, s.backend, dbuf[:0], refs, n, tag)
	if err != nil {
		if errors.Is(err, engine.ErrInvalidCost) || errors.Is(err, engine.ErrInvalidKeys) {
			return false, badRequest("%v", err)
		}
		if errors.Is(err, engine.ErrNeedsTag) {
			return false, badRequest("the request's limits use different keys, which this store can decide together only when placed by a tag: configure the service's cluster tag and send a descriptor entry with that key")
		}
		if ctx.Err() != nil {
			return false, status.FromContextError(ctx.Err()).Err()
		}
		// The store's error may name internal addresses: it goes to the
		// metrics, not to the client.
		return false, status.Error(codes.Unavailable, "rls: the rate-limit store failed")
	}
	for j, i := range at {
		descs[i].decided = true
		descs[i].d = gd.Limits[j]
	}
	return !gd.Allowed, nil
}

// respond builds the response and counts the metrics.
func (s *Service) respond(descs []descriptor, over bool) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(descs)),
	}
	if over {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	binding := -1 // the descriptor whose limit headers show
	for i := range descs {
		d := &descs[i]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		r := d.rule
		if r == nil {
			continue
		}
		rm := s.m.rules[r]
		rm.requests.Inc()
		if r.Unlimited {
			continue
		}
		st.CurrentLimit = currentLimit(r)
		refused := d.never || d.decided && !d.d.Allowed
		switch {
		case refused && r.Shadow:
			rm.shadow.Inc()
		case refused:
			rm.over.Inc()
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		case d.decided && float64(d.d.Limit-d.d.Remaining) > s.near*float64(d.d.Limit):
			rm.near.Inc()
		}
		if d.decided {
			st.LimitRemaining = uint32(d.d.Remaining)
			wait := d.d.Reset
			if !d.d.Allowed {
				wait = d.d.RetryAfter
			}
			st.DurationUntilReset = durationpb.New(wait)
			if !r.Shadow && (binding < 0 || tighter(d, &descs[binding], over)) {
				binding = i
			}
		}
	}
	if s.headers && binding >= 0 {
		d := &descs[binding]
		p := d.rule.Policy
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
			&corev3.HeaderValue{Key: "RateLimit-Policy", Value: s.headerPolicy[p]},
			&corev3.HeaderValue{Key: "RateLimit", Value: s.ratePrefix[p] + strconv.Itoa(d.d.Remaining) +
				";t=" + strconv.FormatInt(headerfmt.CeilSeconds(d.d.Reset), 10)})
		if over && !d.d.Allowed {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
				&corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(headerfmt.CeilSeconds(d.d.RetryAfter), 10)})
		}
	}
	return resp
}

// tighter reports whether a's limit binds more than b's: on a refusal the
// refusing limit with the longest wait, otherwise the least remaining.
func tighter(a, b *descriptor, over bool) bool {
	if over {
		if a.d.Allowed != b.d.Allowed {
			return !a.d.Allowed
		}
		return a.d.RetryAfter > b.d.RetryAfter
	}
	return a.d.Remaining < b.d.Remaining
}

// currentLimit renders a rule as the response's RateLimit message: the
// configured unit and multiplier, or, for a window key, the largest unit
// that divides the window (seconds, with the multiplier rounded up, when
// none does).
func currentLimit(r *Rule) *rlsv3.RateLimitResponse_RateLimit {
	cl := &rlsv3.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: uint32(r.Limit)}
	unit, mult := r.Unit, int64(r.UnitMultiplier)
	if units[unit]*time.Duration(mult) != r.Window {
		unit, mult = "second", headerfmt.CeilSeconds(r.Window)
		for _, u := range []string{"day", "hour", "minute"} {
			if r.Window%units[u] == 0 {
				unit, mult = u, int64(r.Window/units[u])
				break
			}
		}
	}
	cl.Unit = rlsv3.RateLimitResponse_RateLimit_Unit(rlsv3.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(unit)])
	if mult != 1 {
		cl.UnitMultiplier = wrapperspb.UInt32(uint32(min(mult, 1<<32-1)))
	}
	return cl
}
