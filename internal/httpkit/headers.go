package httpkit

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/headerfmt"
)

// Headers selects the header families a response carries. httplimit
// exports it and its flags under the same names, and documents them there.
// The zero value writes none.
type Headers uint8

// The header families (httplimit.HeaderDraft, …).
const (
	HeaderDraft Headers = 1 << iota
	HeaderX
	HeaderRetryAfter

	HeadersAll = HeaderDraft | HeaderX | HeaderRetryAfter
)

// Canonical header keys, as http.Header stores them. The draft spells the
// first two RateLimit-Policy and RateLimit; header names are
// case-insensitive, and Go writes the canonical form.
const (
	HeaderRateLimitPolicy = "Ratelimit-Policy"
	HeaderRateLimit       = "Ratelimit"
	HeaderXLimit          = "X-Ratelimit-Limit"
	HeaderXRemaining      = "X-Ratelimit-Remaining"
	HeaderXReset          = "X-Ratelimit-Reset"
	HeaderRetryAfterKey   = "Retry-After"
)

// MaxPolicyNameLen bounds policy names shown in headers, so that the values
// of one response fit one fixed-size block (see HeaderWriter.Write).
const MaxPolicyNameLen = 64

// ErrInvalidOption is wrapped by the errors of a bad writer or tier
// (httplimit.ErrInvalidOption is this value).
var ErrInvalidOption = errors.New("httplimit: invalid option")

// HeaderWriter writes the rate-limit headers of one backend's decisions.
//
// It is built for the hot path, where rendering five header values per
// response would cost more than the decision itself. Values that depend
// only on the policy (RateLimit-Policy, X-RateLimit-Limit) are rendered
// once; the small numbers X-RateLimit-Remaining and Retry-After take come
// preformatted from a table shared by the process (headerfmt.Int).
// RateLimit and X-RateLimit-Reset are rendered on
// first use into small direct-mapped caches: a response whose values were
// rendered recently (the same remaining count and seconds to reset, the
// same reset second) reuses them, so that in a steady state the writer
// allocates nothing, and otherwise it allocates the new value.
//
// Header slices are therefore shared between responses. That is safe for
// everything http.Header offers (Set and Del replace a slice, Add appends
// to a copy since each slice is capped at its length), but not for writing
// into a value slice in place, which no handler should do. A HeaderWriter
// is safe for concurrent use: cache entries are immutable once published.
type HeaderWriter struct {
	backend     engine.Backend
	policy      engine.Policy
	which       Headers
	draftPolicy []string // "free";q=100;w=60
	draftPrefix string   // "free";r=
	limit       []string // 100
	rateLimit   [rateLimitSlots]atomic.Pointer[rateLimitEntry]
	reset       [resetSlots]atomic.Pointer[resetEntry]
}

// Cache sizes. A RateLimit value is a pair (remaining, t): with 1024 slots
// the pairs a policy's clients are at within a few seconds mostly stay
// cached. Reset values are epoch seconds within one window of now, so 256
// slots indexed by the second hold every live one for windows up to about
// four minutes. Together about 10 KiB of slots per policy, plus the
// entries (about 80 bytes each).
const (
	rateLimitSlots = 1024
	resetSlots     = 256
)

type rateLimitEntry struct {
	remaining int
	t         int64
	val       [1]string
}

type resetEntry struct {
	epoch int64
	val   [1]string
}

// NewHeaderWriter returns a writer for b's decisions, writing the families
// in which. The policy name must be 1 to MaxPolicyNameLen printable ASCII
// characters (it is printed as a structured-field string).
func NewHeaderWriter(b engine.Backend, which Headers) (*HeaderWriter, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: nil backend", ErrInvalidOption)
	}
	p := b.Policy()
	if err := CheckPolicyName(p.Name); err != nil {
		return nil, err
	}
	name := headerfmt.SFString(p.Name)
	return &HeaderWriter{
		backend:     b,
		policy:      p,
		which:       which,
		draftPolicy: []string{name + ";q=" + strconv.Itoa(p.Limit) + ";w=" + strconv.FormatInt(headerfmt.CeilSeconds(p.Window), 10)},
		draftPrefix: name + ";r=",
		limit:       []string{strconv.Itoa(p.Limit)},
	}, nil
}

// CheckPolicyName reports whether name can be shown in headers.
func CheckPolicyName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: policy name is empty (headers and metrics name the policy)", ErrInvalidOption)
	}
	if len(name) > MaxPolicyNameLen {
		return fmt.Errorf("%w: policy name %.20q… is longer than %d bytes", ErrInvalidOption, name, MaxPolicyNameLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: policy name %q has a byte outside printable ASCII", ErrInvalidOption, name)
		}
	}
	return nil
}

// Policy returns the policy of the writer's backend.
func (hw *HeaderWriter) Policy() engine.Policy { return hw.policy }

// Backend returns the writer's backend.
func (hw *HeaderWriter) Backend() engine.Backend { return hw.backend }

// DraftPolicy is the writer's RateLimit-Policy value ("free";q=100;w=60).
func (hw *HeaderWriter) DraftPolicy() string { return hw.draftPolicy[0] }

// ceilUnix is t in epoch seconds, rounded up.
func ceilUnix(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// resetUnix is the X-RateLimit-Reset value: the wall-clock moment the
// oldest live entry leaves the window, in epoch seconds, rounded up.
func (hw *HeaderWriter) resetUnix(d engine.Decision) int64 {
	return ceilUnix(hw.backend.WallTime(d.At + int64(d.Reset)))
}

// Write sets the headers of d on h. Retry-After is written only for
// refusals (and only when HeaderRetryAfter is selected).
func (hw *HeaderWriter) Write(h http.Header, d engine.Decision) {
	hw.WriteRetry(h, d, !d.Allowed)
}

// WriteRetry sets the headers of d on h; retry says whether Retry-After
// belongs (a refusal not in shadow mode).
func (hw *HeaderWriter) WriteRetry(h http.Header, d engine.Decision, retry bool) {
	if hw.which&HeaderDraft != 0 {
		h[HeaderRateLimitPolicy] = hw.draftPolicy
		h[HeaderRateLimit] = hw.rateLimitValue(d.Remaining, headerfmt.CeilSeconds(d.Reset))
	}
	if hw.which&HeaderX != 0 {
		h[HeaderXLimit] = hw.limit
		h[HeaderXRemaining] = headerfmt.Int(int64(d.Remaining))
		h[HeaderXReset] = hw.resetValue(hw.resetUnix(d))
	}
	if retry && hw.which&HeaderRetryAfter != 0 {
		h[HeaderRetryAfterKey] = headerfmt.Int(headerfmt.CeilSeconds(d.RetryAfter))
	}
	if d.Limit != hw.policy.Limit && d.Limit > 0 {
		hw.writeKeyLimit(h, d)
	}
}

// writeKeyLimit replaces the policy's limit in the headers WriteRetry
// wrote with d's: a key with a limit of its own
// (engine.Limiter.SetOverrides). It is rare, and rendered per request.
func (hw *HeaderWriter) writeKeyLimit(h http.Header, d engine.Decision) {
	if hw.which&HeaderDraft != 0 {
		h[HeaderRateLimitPolicy] = []string{hw.draftPolicyOf(d)}
	}
	if hw.which&HeaderX != 0 {
		h[HeaderXLimit] = []string{strconv.Itoa(d.Limit)}
	}
}

// rateLimitValue returns the RateLimit header slice for (remaining, t),
// from the cache or newly rendered (and cached).
func (hw *HeaderWriter) rateLimitValue(remaining int, t int64) []string {
	slot := &hw.rateLimit[(uint64(remaining)*0x9e3779b97f4a7c15^uint64(t))%rateLimitSlots]
	if e := slot.Load(); e != nil && e.remaining == remaining && e.t == t {
		return e.val[:]
	}
	var buf [96]byte
	b := append(buf[:0], hw.draftPrefix...)
	b = strconv.AppendInt(b, int64(remaining), 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, t, 10)
	e := &rateLimitEntry{remaining: remaining, t: t, val: [1]string{string(b)}}
	slot.Store(e)
	return e.val[:]
}

// resetValue returns the X-RateLimit-Reset header slice for an epoch
// second, from the cache or newly rendered (and cached).
func (hw *HeaderWriter) resetValue(epoch int64) []string {
	slot := &hw.reset[uint64(epoch)%resetSlots]
	if e := slot.Load(); e != nil && e.epoch == epoch {
		return e.val[:]
	}
	e := &resetEntry{epoch: epoch, val: [1]string{strconv.FormatInt(epoch, 10)}}
	slot.Store(e)
	return e.val[:]
}

// draftPolicyOf is the RateLimit-Policy value of d's decision: the
// writer's, or, for a key with a limit of its own
// (engine.Limiter.SetOverrides), one with that limit.
func (hw *HeaderWriter) draftPolicyOf(d engine.Decision) string {
	if d.Limit == hw.policy.Limit || d.Limit <= 0 {
		return hw.draftPolicy[0]
	}
	return strings.TrimSuffix(hw.draftPrefix, ";r=") + ";q=" + strconv.Itoa(d.Limit) +
		";w=" + strconv.FormatInt(headerfmt.CeilSeconds(hw.policy.Window), 10)
}

// WriteLimits sets the headers of a decision over several limits on h,
// hws[i] being the writer of limit i's policy: RateLimit-Policy lists
// every policy once, in order; RateLimit, X-RateLimit-* and Retry-After
// (on a refusal) are the binding limit's, written by hws[gd.Binding].
func WriteLimits(h http.Header, hws []*HeaderWriter, gd engine.GroupDecision) {
	if len(hws) == 0 || gd.Binding < 0 || gd.Binding >= len(hws) || len(gd.Limits) != len(hws) {
		return
	}
	hw := hws[gd.Binding]
	hw.WriteRetry(h, gd.Limits[gd.Binding], !gd.Allowed)
	if hw.which&HeaderDraft == 0 || len(hws) == 1 {
		return
	}
	var b strings.Builder
	for i, x := range hws {
		dup := false
		for _, o := range hws[:i] {
			dup = dup || o.policy.Name == x.policy.Name
		}
		if dup {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(x.draftPolicyOf(gd.Limits[i]))
	}
	h[HeaderRateLimitPolicy] = []string{b.String()}
}
