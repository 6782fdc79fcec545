package httplimit

import (
	"net/http"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/httpkit"
)

// Headers selects the header families a response carries. The zero value
// writes none; HeadersAll is the default of New.
type Headers = httpkit.Headers

const (
	// HeaderDraft is the IETF httpapi draft's structured-field pair:
	//
	//	RateLimit-Policy: "free";q=100;w=60
	//	RateLimit: "free";r=42;t=17
	//
	// q is the limit, w the window in seconds (rounded up), r the remaining
	// quota and t the seconds until the oldest live entry leaves the window
	// (Decision.Reset, rounded up).
	HeaderDraft = httpkit.HeaderDraft
	// HeaderX is the widely used trio X-RateLimit-Limit,
	// X-RateLimit-Remaining and X-RateLimit-Reset, the last in epoch seconds
	// (rounded up) of the moment the oldest live entry leaves the window.
	HeaderX = httpkit.HeaderX
	// HeaderRetryAfter is Retry-After on refusals: Decision.RetryAfter in
	// whole seconds, rounded up, so that waiting that long always suffices.
	HeaderRetryAfter = httpkit.HeaderRetryAfter

	// HeadersAll is every family.
	HeadersAll = httpkit.HeadersAll
)

// tierWriter is one policy's header writer and its pre-rendered refusal
// body (problem.go).
type tierWriter struct {
	*httpkit.HeaderWriter
	policy  engine.Policy
	problem problemParts
}

// newTierWriter returns the writer of b's decisions, writing the header
// families in which.
func newTierWriter(b engine.Backend, which Headers) (*tierWriter, error) {
	hw, err := httpkit.NewHeaderWriter(b, which)
	if err != nil {
		return nil, err
	}
	return &tierWriter{HeaderWriter: hw, policy: hw.Policy(), problem: newProblemParts(hw.Policy())}, nil
}

// write sets the headers of d on h; retry says whether Retry-After
// belongs.
func (tw *tierWriter) write(h http.Header, d engine.Decision, retry bool) {
	tw.WriteRetry(h, d, retry)
}
