package httplimit

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/slidegate/slidegate/engine"
)

// Headers selects the header families a response carries. The zero value
// writes none; HeadersAll is the default of New.
type Headers uint8

const (
	// HeaderDraft is the IETF httpapi draft's structured-field pair:
	//
	//	RateLimit-Policy: "free";q=100;w=60
	//	RateLimit: "free";r=42;t=17
	//
	// q is the limit, w the window in seconds (rounded up), r the remaining
	// quota and t the seconds until the oldest live entry leaves the window
	// (Decision.Reset, rounded up).
	HeaderDraft Headers = 1 << iota
	// HeaderX is the widely used trio X-RateLimit-Limit,
	// X-RateLimit-Remaining and X-RateLimit-Reset, the last in epoch seconds
	// (rounded up) of the moment the oldest live entry leaves the window.
	HeaderX
	// HeaderRetryAfter is Retry-After on refusals: Decision.RetryAfter in
	// whole seconds, rounded up, so that waiting that long always suffices.
	HeaderRetryAfter

	// HeadersAll is every family.
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

// HeaderWriter writes the rate-limit headers of one backend's decisions.
// The values that depend only on the policy are rendered once, when the
// writer is made; per response it renders the numbers into one small block,
// which is the only allocation it makes. A HeaderWriter is safe for
// concurrent use.
type HeaderWriter struct {
	backend     engine.Backend
	policy      engine.Policy
	which       Headers
	draftPolicy string // "free";q=100;w=60
	draftPrefix string // "free";r=
	limit       string // 100
}

// NewHeaderWriter returns a writer for b's decisions, writing the families
// in which. The policy name must be 1 to MaxPolicyNameLen printable ASCII
// characters (it is printed as a structured-field string).
func NewHeaderWriter(b engine.Backend, which Headers) (*HeaderWriter, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: nil backend", ErrInvalidOption)
	}
	p := b.Policy()
	if err := checkPolicyName(p.Name); err != nil {
		return nil, err
	}
	name := sfString(p.Name)
	return &HeaderWriter{
		backend:     b,
		policy:      p,
		which:       which,
		draftPolicy: name + ";q=" + strconv.Itoa(p.Limit) + ";w=" + strconv.FormatInt(ceilSeconds(p.Window), 10),
		draftPrefix: name + ";r=",
		limit:       strconv.Itoa(p.Limit),
	}, nil
}

// checkPolicyName reports whether name can be shown in headers.
func checkPolicyName(name string) error {
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

// sfString renders s (printable ASCII) as an RFC 8941 sf-string.
func sfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return b.String()
}

// Policy returns the policy of the writer's backend.
func (hw *HeaderWriter) Policy() engine.Policy { return hw.policy }

// Backend returns the writer's backend.
func (hw *HeaderWriter) Backend() engine.Backend { return hw.backend }

// Which returns the header families the writer writes.
func (hw *HeaderWriter) Which() Headers { return hw.which }

// ceilSeconds is d in whole seconds, rounded up; 0 for d ≤ 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// ceilUnix is t in epoch seconds, rounded up.
func ceilUnix(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// RetryAfterSeconds is d.RetryAfter in whole seconds, rounded up: the
// Retry-After value of a refusal.
func RetryAfterSeconds(d engine.Decision) int64 { return ceilSeconds(d.RetryAfter) }

// ResetSeconds is d.Reset in whole seconds, rounded up: the t parameter of
// the RateLimit header.
func ResetSeconds(d engine.Decision) int64 { return ceilSeconds(d.Reset) }

// ResetUnix is the X-RateLimit-Reset value: the wall-clock moment the
// oldest live entry leaves the window, in epoch seconds, rounded up.
func (hw *HeaderWriter) ResetUnix(d engine.Decision) int64 {
	return ceilUnix(hw.backend.WallTime(d.At + int64(d.Reset)))
}

// headerBlock holds one response's header values: the string headers of
// the http.Header entries and the bytes of the rendered numbers, in one
// allocation. Every slice handed to the header map is capped at length 1,
// so a later Header().Add appends to a copy and never into a neighbour.
//
// The block is 256 bytes, one size class: 96 for the strings and 160 for
// the bytes, which hold the RateLimit prefix of any unescaped name of up to
// MaxPolicyNameLen bytes (≤ 69) and the five numbers (remaining ≤ 10
// digits, t and Retry-After ≤ 8 for windows ≤ MaxWindow, the reset epoch
// 10 to 11, ";t=" 3). A name full of escapes can exceed it; append then
// moves on to a heap array, which is still correct (see str).
type headerBlock struct {
	vals [6]string
	buf  [160]byte
}

// Write sets the headers of d on h. Retry-After is written only for
// refusals (and only when HeaderRetryAfter is selected).
func (hw *HeaderWriter) Write(h http.Header, d engine.Decision) {
	hw.write(h, d, !d.Allowed)
}

// write sets the headers; retry says whether Retry-After belongs.
func (hw *HeaderWriter) write(h http.Header, d engine.Decision, retry bool) {
	if hw.which == 0 {
		return
	}
	blk := new(headerBlock)
	b := blk.buf[:0]
	n := 0
	// str returns the bytes appended since start as a string that shares
	// b's memory: bytes are only ever appended after it, never rewritten.
	// (b stays inside blk.buf, whose size bounds every value; were it ever
	// to grow, the strings would share the new array, equally unwritten.)
	str := func(start int) string {
		if len(b) == start {
			return ""
		}
		return unsafe.String(&b[start], len(b)-start)
	}
	set := func(key, v string) {
		blk.vals[n] = v
		h[key] = blk.vals[n : n+1 : n+1]
		n++
	}
	if hw.which&HeaderDraft != 0 {
		set(HeaderRateLimitPolicy, hw.draftPolicy)
		s := len(b)
		b = append(b, hw.draftPrefix...)
		b = strconv.AppendInt(b, int64(d.Remaining), 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, ceilSeconds(d.Reset), 10)
		set(HeaderRateLimit, str(s))
	}
	if hw.which&HeaderX != 0 {
		set(HeaderXLimit, hw.limit)
		s := len(b)
		b = strconv.AppendInt(b, int64(d.Remaining), 10)
		set(HeaderXRemaining, str(s))
		s = len(b)
		b = strconv.AppendInt(b, hw.ResetUnix(d), 10)
		set(HeaderXReset, str(s))
	}
	if retry && hw.which&HeaderRetryAfter != 0 {
		s := len(b)
		b = strconv.AppendInt(b, ceilSeconds(d.RetryAfter), 10)
		set(HeaderRetryAfterKey, str(s))
	}
}
