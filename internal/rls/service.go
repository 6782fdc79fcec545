package rls

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/headerfmt"
)

// Bounds and defaults of a request. No part of a request a client can
// influence is an error: every value length, number of descriptors and
// entries, and hits_addend gets a decision.
const (
	// MaxKeyBytes is the longest key a rule's state is stored under: a
	// descriptor whose entries make a longer one is keyed by their SHA-256
	// digest instead (the same entries, the same digest).
	MaxKeyBytes = 512
	// DefaultNearLimitRatio is the share of a limit above which an allowed
	// request counts as near the limit (as in envoyproxy/ratelimit).
	DefaultNearLimitRatio = 0.8
)

// The peer's response header names (its LIMIT_*_HEADER defaults).
const (
	DefaultLimitHeader     = "RateLimit-Limit"
	DefaultRemainingHeader = "RateLimit-Remaining"
	DefaultResetHeader     = "RateLimit-Reset"
)

// Option configures a Service.
type Option func(*options)

type options struct {
	reg      prometheus.Registerer
	headers  bool
	peerHdr  bool
	hdrNames [3]string
	metadata bool
	near     float64
	tagKey   string
	refused  Refusals
	vecs     *vectors // a Reloader's, kept across its generations
	shadow   bool     // every refusal answered OK (SHADOW_MODE)
	quota    bool     // every rule in quota mode (QUOTA_MODE)
}

// WithRegisterer registers the service's metrics on reg (the server's
// admin registry); without it the service keeps no metrics.
func WithRegisterer(reg prometheus.Registerer) Option { return func(o *options) { o.reg = reg } }

// WithHeaders makes every response that matched a limit carry the IETF
// draft headers of its binding limit, RateLimit-Policy and RateLimit, for
// Envoy to add to the client's response, plus Retry-After on OVER_LIMIT.
func WithHeaders(on bool) Option { return func(o *options) { o.headers = on } }

// WithRateLimitHeaders makes responses carry envoyproxy/ratelimit's
// headers (its LIMIT_RESPONSE_HEADERS_ENABLED) under these names (its
// LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER; empty
// names take DefaultLimitHeader, DefaultRemainingHeader,
// DefaultResetHeader): the limit, remaining and whole seconds until reset
// of the descriptor closest to its limit, or of the last that refused.
func WithRateLimitHeaders(limit, remaining, reset string) Option {
	return func(o *options) {
		o.peerHdr = true
		o.hdrNames = [3]string{cmp.Or(limit, DefaultLimitHeader), cmp.Or(remaining, DefaultRemainingHeader), cmp.Or(reset, DefaultResetHeader)}
	}
}

// WithDynamicMetadata makes responses carry dynamic_metadata as
// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA does: the domain, the
// descriptors, hits_addend, quotaModeEnabled and quotaModeViolations.
func WithDynamicMetadata(on bool) Option { return func(o *options) { o.metadata = on } }

// WithClusterTag names the descriptor entry key whose value places every
// key of a request together on a backend that keeps keys in partitions
// (an engine.GroupBackend whose NeedsTag is true: Redis Cluster), so that one atomic call
// decides all the request's descriptors. The first entry with that key in
// the request's descriptors is the tag (typically the client's identity:
// "user_id" or "remote_address"); a limit keyed by other values then
// counts per tag value too. Without it, or when a request has no such
// entry, such a backend decides only requests whose limits share one key,
// and refuses others (OVER_LIMIT, nothing charged). Other backends ignore
// it.
func WithClusterTag(entryKey string) Option { return func(o *options) { o.tagKey = entryKey } }

// Refusals receives the descriptors answered OVER_LIMIT (WithRefusals).
type Refusals interface {
	// Record is called with the rule (domain/descriptor, as the metrics
	// label it; "(override)" for a request's own limit), the key (the
	// descriptor's entries) and the cost. It runs on the decision path
	// and must be quick; the key is valid only during the call.
	Record(rule, key string, cost int)
}

// WithRefusals has r record each descriptor answered OVER_LIMIT. An
// interface rather than a func: a method value would cost each refusal
// a call through its wrapper.
func WithRefusals(r Refusals) Option {
	return func(o *options) { o.refused = r }
}

// WithNearLimitRatio sets the share of a limit (0 < ratio < 1) above which
// an allowed request counts in the near-limit metric; the default is
// DefaultNearLimitRatio.
func WithNearLimitRatio(r float64) Option { return func(o *options) { o.near = r } }

// WithShadowMode is envoyproxy/ratelimit's SHADOW_MODE: requests are
// decided as usual, and counted in the metrics, but a request the limits
// refuse is answered OK; its descriptors keep their OVER_LIMIT statuses,
// and MetricGlobalShadow counts it. A refused request is charged nothing,
// as when the answer is OVER_LIMIT.
func WithShadowMode(on bool) Option { return func(o *options) { o.shadow = on } }

// WithQuotaMode is envoyproxy/ratelimit's QUOTA_MODE: every rule is
// decided as a rule with quota_mode is (a refusal is reported OK, listed
// in the dynamic metadata's quotaModeViolations, never OVER_LIMIT).
func WithQuotaMode(on bool) Option { return func(o *options) { o.quota = on } }

// Service is the Envoy rate limit service (envoy.service.ratelimit.v3):
// it decides ShouldRateLimit requests with a configuration in
// envoyproxy/ratelimit's format over any engine.GroupBackend whose
// policies are the configuration's (Config.Policies).
//
// Each of a request's descriptors selects at most one rule (see Config and
// docs/envoy.md for the precedence). The enforced rules the request
// selects are decided together, all or nothing, in one call of the
// backend, each at its descriptor's cost: the request is charged to every
// one of them, or, when any one refuses, to none. The key a rule counts
// against is the descriptor's entries, so a rule written without a value
// keeps one log per distinct value. A descriptor whose cost is 0 is only
// checked: it is reported with its limit's state and charged nothing.
//
// Shadow and quota rules are decided in a second call, all or nothing
// among themselves, and only when the enforced rules allowed the request:
// a request that Envoy refuses never reaches the upstream, so it is not
// counted against limits that merely watch. A shadow or quota rule that
// would have refused is counted (metrics) and reported OK; it never
// changes the overall code.
//
// A descriptor's limit override (RateLimitDescriptor.limit) is decided
// the same way, with its own limit and unit, on a backend that can take
// on more policies: a MemoryBackends group, or a store group with an
// Extend method (redisstore's Group, alone or through WithPeek). Over
// another backend (a plain *engine.Group) the configured rule decides it.
//
// A Service is safe for concurrent use. It does not own the backend:
// closing the backend is the caller's business.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	cfg      *Config
	backend  engine.GroupBackend
	peek     refPeeker  // backend's, nil when it cannot read state
	ov       *overrides // nil when the backend cannot decide limit overrides
	domains  map[string]*domainState
	policies []engine.Policy
	o        options
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

// refPeeker is implemented by backends that can read limits' state
// without changing it (*engine.Group, WithPeek's groups). The service
// asks once per backend, when it gets one (peekerOf).
type refPeeker interface {
	PeekRefs(ctx context.Context, dst []engine.Decision, refs []engine.Ref) ([]engine.Decision, error)
}

// peekerOf returns b as a refPeeker, or nil when it cannot read state.
func peekerOf(b engine.GroupBackend) refPeeker {
	pk, _ := b.(refPeeker)
	return pk
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
	s := &Service{cfg: cfg, backend: b, peek: peekerOf(b), domains: map[string]*domainState{}, policies: want, o: o}
	if len(want) > 0 {
		s.ov = overridesOf(b)
	}
	m, err := newMetrics(o.reg, cfg, b, o.vecs)
	if err != nil {
		return nil, err
	}
	s.m = m
	for name, root := range cfg.domains {
		s.domains[name] = &domainState{root: root, latency: m.latency.WithLabelValues("", name)}
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
func (noPolicies) NeedsTag() bool            { return false }
func (noPolicies) DecideGroup(context.Context, []engine.Decision, engine.GroupRequest) (engine.GroupDecision, error) {
	return engine.GroupDecision{}, fmt.Errorf("%w: the configuration has no policies", engine.ErrInvalidKeys)
}
func (noPolicies) WallTime(int64) time.Time { return time.Time{} }
func (noPolicies) Close() error             { return nil }

// descriptor is one request descriptor during a decision.
type descriptor struct {
	rule      *Rule
	unlimited bool // matched an unlimited rule (even one replaced)
	key       string
	cost      int  // 0: check only
	never     bool // the limit can never admit the cost (limit 0, or cost above it)
	decided   bool // d holds the engine's decision or, when peeked, the state
	peeked    bool
	d         engine.Decision
}

// enforced reports whether rule r can refuse a request: not a shadow or
// quota rule, and not under WithQuotaMode.
func (s *Service) enforced(r *Rule) bool { return r.enforced() && !s.o.quota }

// limits reports whether the descriptor is decided against a limit.
func (d *descriptor) limits() bool { return d.rule != nil && !d.rule.Unlimited }

// badRequest answers InvalidArgument; the message quotes no more than the
// bounded fields of the request.
func badRequest(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "rls: "+format, args...)
}

// ShouldRateLimit decides a request. Only a request no Envoy sends (no
// domain, no descriptors) is answered with an error, InvalidArgument, and
// charges nothing; a backend failure is Unavailable.
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
	in := req.GetDescriptors()
	switch {
	case domain == "":
		return nil, badRequest("empty domain")
	case len(in) == 0:
		return nil, badRequest("no descriptors")
	}
	ds := s.domains[domain]
	var dbuf [8]descriptor
	descs := dbuf[:0]
	if len(in) > len(dbuf) {
		descs = make([]descriptor, 0, len(in))
	}
	reqCost := max(int(req.GetHitsAddend()), 1)
	var ebuf [8]entry
	var kbuf [128]byte // a key's bytes, before its one string
	kb := kbuf[:0]
	for _, d := range in {
		dd := descriptor{cost: reqCost}
		if h := d.GetHitsAddend(); h != nil {
			// As envoyproxy/ratelimit: a descriptor's own hits_addend may
			// be 0, which checks without charging.
			dd.cost = int(min(h.GetValue(), math.MaxInt32))
		}
		if ds != nil {
			es := d.GetEntries()
			entries := ebuf[:0]
			for _, e := range es {
				entries = append(entries, entry{e.GetKey(), e.GetValue()})
			}
			r, share := match(ds.root, entries)
			if lim := d.GetLimit(); lim != nil {
				if or := s.overrideRule(domain, lim); or != nil {
					r, share = or, nil
					if r.ov != nil {
						// An override's policy serves every domain: its
						// key names the domain too, as the peer's does.
						entries = append([]entry{{"", domain}}, entries...)
					}
				}
			}
			dd.rule = r
			if r != nil && r.Unlimited {
				dd.unlimited = true
			}
			if r != nil && r.Policy >= 0 {
				dd.key, kb = storeKey(kb, entries, share)
			}
		}
		descs = append(descs, dd)
	}
	// replaces, as envoyproxy/ratelimit: every matched rule's replaces
	// names first, then every matched rule with one of those names drops
	// out, whatever the descriptors' order.
	var replaced map[string]bool
	for i := range descs {
		if r := descs[i].rule; r != nil && len(r.Replaces) > 0 {
			if replaced == nil {
				replaced = map[string]bool{}
			}
			for _, n := range r.Replaces {
				replaced[n] = true
			}
		}
	}
	for i := range descs {
		if r := descs[i].rule; r != nil && r.Name != "" && replaced[r.Name] {
			descs[i].rule = nil
		}
	}
	for i := range descs {
		d := &descs[i]
		if d.limits() && d.cost > 0 {
			d.never = d.rule.Limit == 0 || d.cost > s.policyLimit(d.rule)
		}
	}
	if ds == nil {
		return s.respond(req, descs, false), nil
	}
	tag := s.tagOf(in)
	sc := scratchPool.Get().(*scratch)
	defer putScratch(sc)
	over, err := s.decideClass(ctx, descs, true, tag, sc)
	if err != nil {
		return nil, err
	}
	if !over {
		if _, err := s.decideClass(ctx, descs, false, tag, sc); err != nil {
			return nil, err
		}
	}
	if err := s.peekRest(ctx, descs, sc); err != nil {
		return nil, err
	}
	ds.latency.Observe(time.Since(start).Seconds())
	return s.respond(req, descs, over), nil
}

// policyLimit is the most a rule's policy admits at once.
func (s *Service) policyLimit(r *Rule) int {
	switch {
	case r.ov != nil:
		return r.ov.Limit
	case r.Policy < 0:
		return int(min(r.Limit, int64(engine.MaxCounterLimit)))
	}
	return s.policies[r.Policy].Limit
}

// overrideRule returns the rule a descriptor's limit override stands for,
// or nil when the backend cannot decide overrides, the unit is unknown, or
// the bound of distinct overrides is reached: then the configured rule
// decides.
func (s *Service) overrideRule(domain string, lim *ratelimitv3.RateLimitDescriptor_RateLimitOverride) *Rule {
	if s.ov == nil {
		return nil
	}
	unit := strings.ToLower(lim.GetUnit().String())
	w, ok := units[unit]
	if !ok {
		return nil
	}
	r := &Rule{Domain: domain, Path: "(override)", Limit: int64(lim.GetRequestsPerUnit()), Unit: unit, UnitMultiplier: 1, Window: w, Policy: -1}
	if r.Limit > 0 {
		i, p, ok := s.ov.policy(r.Limit, w)
		if !ok {
			return nil
		}
		r.Policy, r.ov, r.Algorithm = i, &p, p.Algorithm
	}
	return r
}

// backendFor returns the backend that decides the descriptors at at, and
// its peeker (nil when it cannot read state): the one with the overrides
// when one of them has an override.
func (s *Service) backendFor(descs []descriptor, at []int) (engine.GroupBackend, refPeeker) {
	for _, i := range at {
		if descs[i].rule.ov != nil {
			ob := s.ov.backend()
			return ob.GroupBackend, ob.peek
		}
	}
	return s.backend, s.peek
}

// storeKey returns the key of a rule's state for a descriptor's entries:
// length-prefixed, so that no two distinct entry lists share a key, with
// each shared entry's value replaced by its wildcard, and a SHA-256 digest
// of all that when it is longer than MaxKeyBytes. It builds the key in b
// and returns b, for the next key.
func storeKey(b []byte, entries []entry, share []string) (string, []byte) {
	b = b[:0]
	for i, e := range entries {
		v := e.value
		if share != nil && share[i] != "" {
			v = share[i]
		}
		b = strconv.AppendInt(b, int64(len(e.key)), 10)
		b = append(b, ':')
		b = append(b, e.key...)
		b = strconv.AppendInt(b, int64(len(v)), 10)
		b = append(b, ':')
		b = append(b, v...)
	}
	if len(b) > MaxKeyBytes {
		sum := sha256.Sum256(b)
		return "#" + hex.EncodeToString(sum[:]), b
	}
	return string(b), b
}

// tagOf returns the value of the first entry of in whose key is the
// configured cluster tag key, or "" (see WithClusterTag).
func (s *Service) tagOf(in []*ratelimitv3.RateLimitDescriptor) string {
	if s.o.tagKey == "" {
		return ""
	}
	for _, d := range in {
		for _, e := range d.GetEntries() {
			if e.GetKey() == s.o.tagKey {
				return e.GetValue()
			}
		}
	}
	return ""
}

// decideClass decides the descriptors of one class (enforced rules, or
// shadow and quota rules) that cost something, all or nothing, and reports
// whether they refused. A rule that can never admit its cost refuses
// without asking the backend (nothing is charged). A non-empty tag places
// the keys of a partitioned backend together.
func (s *Service) decideClass(ctx context.Context, descs []descriptor, enforced bool, tag string, sc *scratch) (bool, error) {
	var idx [8]int
	at := idx[:0]
	never, same := false, true
	for i := range descs {
		d := &descs[i]
		if !d.limits() || d.cost == 0 || s.enforced(d.rule) != enforced {
			continue
		}
		if d.never {
			never = true
			continue
		}
		if len(at) > 0 && d.cost != descs[at[0]].cost {
			same = false
		}
		at = append(at, i)
	}
	if never || len(at) == 0 {
		return never, nil
	}
	refs, costs := sc.refs[:0], sc.costs[:0]
	for _, i := range at {
		refs = append(refs, engine.Ref{Policy: descs[i].rule.Policy, Key: descs[i].key})
		costs = append(costs, descs[i].cost)
	}
	req := engine.GroupRequest{Refs: refs, Tag: tag}
	if same {
		req.N = costs[0]
	} else {
		req.Costs = costs
	}
	be, _ := s.backendFor(descs, at)
	gd, err := be.DecideGroup(ctx, sc.ds[:0], req)
	if err != nil {
		if errors.Is(err, engine.ErrNeedsTag) {
			// The keys cannot be decided together on this store: refused,
			// nothing charged (see WithClusterTag).
			for _, i := range at {
				descs[i].never = true
			}
			return true, nil
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

// scratch holds the refs, costs and decisions a decision hands to its
// backend: through the backend's interface they would escape, so they are
// pooled rather than allocated per request.
type scratch struct {
	refs  [8]engine.Ref
	costs [8]int
	ds    [8]engine.Decision
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// putScratch returns sc to the pool, keeping no keys.
func putScratch(sc *scratch) {
	clear(sc.refs[:])
	scratchPool.Put(sc)
}

// peekRest reads the state of every limited descriptor the backend did
// not decide (checks, and those of a request refused before the backend
// was asked), when the backend can read state.
func (s *Service) peekRest(ctx context.Context, descs []descriptor, sc *scratch) error {
	var idx [8]int
	at := idx[:0]
	for i := range descs {
		d := &descs[i]
		if d.limits() && !d.decided && d.rule.Policy >= 0 {
			at = append(at, i)
		}
	}
	if len(at) == 0 {
		return nil
	}
	_, pk := s.backendFor(descs, at)
	if pk == nil {
		return nil
	}
	refs := sc.refs[:0]
	for _, i := range at {
		refs = append(refs, engine.Ref{Policy: descs[i].rule.Policy, Key: descs[i].key})
	}
	got, err := pk.PeekRefs(ctx, sc.ds[:0], refs)
	if err != nil {
		// Nothing of these was charged: a store that cannot show them
		// leaves their statuses with the limits only, not an error.
		return nil
	}
	for j, i := range at {
		descs[i].decided, descs[i].peeked = true, true
		descs[i].d = got[j]
	}
	return nil
}

// respond builds the response and counts the metrics.
func (s *Service) respond(req *rlsv3.RateLimitRequest, descs []descriptor, over bool) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(descs)),
	}
	// The messages of every descriptor, one allocation of each kind.
	sts := make([]rlsv3.RateLimitResponse_DescriptorStatus, len(descs))
	cls := make([]rlsv3.RateLimitResponse_RateLimit, len(descs))
	durs := make([]durationpb.Duration, len(descs))
	binding := -1 // the descriptor whose IETF headers show
	closest := -1 // the descriptor whose peer headers show
	var violations []int
	for i := range descs {
		d := &descs[i]
		st := &sts[i]
		st.Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = st
		if d.unlimited {
			st.LimitRemaining = math.MaxUint32
		}
		r := d.rule
		if r == nil {
			continue
		}
		rm, metered := s.m.rules[r] // a limit override has no metrics of its own
		if !metered {
			rm = s.m.none
		}
		rm.requests.Inc()
		if r.Unlimited {
			continue
		}
		st.CurrentLimit = currentLimit(&cls[i], r)
		// A check (cost 0) never refuses; a refused request's other
		// descriptors show their state as it is.
		refused := d.cost > 0 && (d.never || d.decided && !d.peeked && !d.d.Allowed)
		if d.decided {
			st.LimitRemaining = s.remaining(r, d.d.Remaining)
			wait := d.d.Reset
			if refused && !d.never {
				wait = d.d.RetryAfter
			}
			st.DurationUntilReset = setDuration(&durs[i], wait)
		} else if d.never || r.Limit == 0 {
			st.DurationUntilReset = setDuration(&durs[i], r.Window)
		}
		switch {
		case refused && (r.Quota || s.o.quota):
			rm.shadow.Inc()
			violations = append(violations, i)
			st.LimitRemaining, st.DurationUntilReset = 0, nil
		case refused && r.Shadow:
			rm.shadow.Inc()
			st.LimitRemaining = 0
		case refused:
			rm.over.Inc()
			if s.o.refused != nil {
				s.o.refused.Record(rm.name, d.key, d.cost)
			}
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			st.LimitRemaining = 0
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		case d.decided && !d.peeked && float64(d.d.Limit-d.d.Remaining) > s.o.near*float64(d.d.Limit):
			rm.near.Inc()
		}
		if refused && s.enforced(r) {
			closest = i
		} else if closest < 0 || resp.Statuses[closest].Code != rlsv3.RateLimitResponse_OVER_LIMIT && st.LimitRemaining < resp.Statuses[closest].LimitRemaining {
			closest = i
		}
		if d.decided && !d.peeked && s.enforced(r) && r.ov == nil && (binding < 0 || tighter(d, &descs[binding], over)) {
			binding = i
		}
	}
	if over {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if s.o.shadow && resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		resp.OverallCode = rlsv3.RateLimitResponse_OK
		s.m.globalShadow.Inc()
	}
	if s.o.peerHdr && closest >= 0 {
		st := resp.Statuses[closest]
		reset := int64(0)
		if st.DurationUntilReset != nil {
			reset = headerfmt.CeilSeconds(st.DurationUntilReset.AsDuration())
		} else {
			reset = headerfmt.CeilSeconds(descs[closest].rule.Window)
		}
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
			&corev3.HeaderValue{Key: s.o.hdrNames[0], Value: strconv.FormatUint(uint64(st.CurrentLimit.GetRequestsPerUnit()), 10)},
			&corev3.HeaderValue{Key: s.o.hdrNames[1], Value: strconv.FormatUint(uint64(st.LimitRemaining), 10)},
			&corev3.HeaderValue{Key: s.o.hdrNames[2], Value: strconv.FormatInt(reset, 10)})
	}
	if s.o.headers && binding >= 0 {
		d := &descs[binding]
		p := d.rule.Policy
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
			&corev3.HeaderValue{Key: "RateLimit-Policy", Value: s.headerPolicy[p]},
			&corev3.HeaderValue{Key: "RateLimit", Value: s.ratePrefix[p] + strconv.Itoa(d.d.Remaining) +
				";t=" + strconv.FormatInt(headerfmt.CeilSeconds(d.d.Reset), 10)})
		if over && !d.d.Allowed && resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
				&corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(headerfmt.CeilSeconds(d.d.RetryAfter), 10)})
		}
	}
	if s.o.metadata {
		resp.DynamicMetadata = metadata(req, descs, violations)
	}
	return resp
}

// remaining is what a descriptor reports as left of its rule's limit: the
// engine's remaining plus what the configured limit has above the
// policy's (a limit above engine.MaxCounterLimit).
func (s *Service) remaining(r *Rule, rem int) uint32 {
	v := int64(rem)
	if r.ov != nil {
		v += r.Limit - int64(r.ov.Limit)
	} else if r.Policy >= 0 {
		v += r.Limit - int64(s.policies[r.Policy].Limit)
	}
	return uint32(min(max(v, 0), math.MaxUint32))
}

// metadata is the response's dynamic_metadata, laid out as
// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA.
func metadata(req *rlsv3.RateLimitRequest, descs []descriptor, violations []int) *structpb.Struct {
	f := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.GetDomain())}
	list := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		df := map[string]*structpb.Value{}
		es := make([]*structpb.Value, 0, len(d.GetEntries()))
		for _, e := range d.GetEntries() {
			es = append(es, structpb.NewStringValue(e.GetKey()+"="+e.GetValue()))
		}
		df["entries"] = structpb.NewListValue(&structpb.ListValue{Values: es})
		if d.GetLimit() != nil {
			df["limit"] = structpb.NewStringValue(d.GetLimit().String())
		}
		if h := d.GetHitsAddend(); h != nil {
			df["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		list = append(list, structpb.NewStructValue(&structpb.Struct{Fields: df}))
	}
	f["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: list})
	if h := req.GetHitsAddend(); h != 0 {
		f["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	if len(violations) > 0 {
		vs := make([]*structpb.Value, len(violations))
		for i, v := range violations {
			vs[i] = structpb.NewNumberValue(float64(v))
		}
		f["quotaModeViolations"] = structpb.NewListValue(&structpb.ListValue{Values: vs})
	}
	quota := false
	for i := range descs {
		if r := descs[i].rule; r != nil && !r.Unlimited && r.Quota {
			quota = true
		}
	}
	f["quotaModeEnabled"] = structpb.NewBoolValue(quota)
	return &structpb.Struct{Fields: f}
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

// setDuration sets p to d, as durationpb.New does, and returns p.
func setDuration(p *durationpb.Duration, d time.Duration) *durationpb.Duration {
	p.Seconds, p.Nanos = int64(d/time.Second), int32(d%time.Second)
	return p
}

// rateLimitUnits are the response's units by their configured names.
var rateLimitUnits = func() map[string]rlsv3.RateLimitResponse_RateLimit_Unit {
	m := map[string]rlsv3.RateLimitResponse_RateLimit_Unit{}
	for name, v := range rlsv3.RateLimitResponse_RateLimit_Unit_value {
		m[strings.ToLower(name)] = rlsv3.RateLimitResponse_RateLimit_Unit(v)
	}
	return m
}()

// currentLimit renders a rule in cl, the response's RateLimit message, and
// returns cl: the configured unit and multiplier, or, for a window key,
// the largest unit that divides the window (seconds, with the multiplier
// rounded up, when none does).
func currentLimit(cl *rlsv3.RateLimitResponse_RateLimit, r *Rule) *rlsv3.RateLimitResponse_RateLimit {
	cl.Name, cl.RequestsPerUnit = r.Name, uint32(r.Limit)
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
	cl.Unit = rateLimitUnits[unit]
	if mult != 1 {
		cl.UnitMultiplier = wrapperspb.UInt32(uint32(min(mult, 1<<32-1)))
	}
	return cl
}
