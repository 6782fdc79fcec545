package httplimit

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/headerfmt"
)

// The refusal path matters as much as the allow path: an abusive client is
// refused at whatever rate it sends. So the middleware's default refusal
// body is rendered from parts prepared once per policy, byte for byte what
// WriteProblem (encoding/json) writes, and written with shared header
// slices; TestProblemFastPathMatches pins the equality.

// problemParts is a policy's refusal body around its variable parts:
// head + seconds + mid + seconds + `,"retry_after_ns":` + ns + "}\n".
type problemParts struct {
	head, mid []byte
}

// detailPrefix is the detail of a refusal of p up to the retry seconds.
func detailPrefix(p engine.Policy) string {
	return "rate limit of policy " + strconv.Quote(p.Name) + " (" + strconv.Itoa(p.Limit) +
		" per " + p.Window.String() + ") exceeded; retry in "
}

func newProblemParts(p engine.Policy) problemParts {
	mustJSON := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil { // strings and ints always marshal
			panic("httplimit: " + err.Error())
		}
		return b
	}
	var head []byte
	head = append(head, `{"type":`...)
	head = append(head, mustJSON(problemType)...)
	head = append(head, `,"title":"Too Many Requests","status":429,"detail":`...)
	detail := mustJSON(detailPrefix(p))
	head = append(head, detail[:len(detail)-1]...) // open: the seconds follow
	var mid []byte
	mid = append(mid, ` s","policy":`...)
	mid = append(mid, mustJSON(p.Name)...)
	mid = append(mid, `,"limit":`...)
	mid = strconv.AppendInt(mid, int64(p.Limit), 10)
	mid = append(mid, `,"window_seconds":`...)
	mid = strconv.AppendInt(mid, headerfmt.CeilSeconds(p.Window), 10)
	mid = append(mid, `,"retry_after_seconds":`...)
	return problemParts{head: head, mid: mid}
}

var (
	problemCT     = []string{"application/problem+json"}
	nosniff       = []string{"nosniff"}
	problemBufs   = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}
	problemStatus = http.StatusTooManyRequests
)

// applied is p with the limit d applied, which differs from p's for a key
// with a limit of its own (engine.Limiter.SetOverrides).
func applied(p engine.Policy, d engine.Decision) engine.Policy {
	if d.Limit > 0 {
		p.Limit = d.Limit
	}
	return p
}

// writeProblem is WriteProblem for hw's policy, without encoding/json.
func (hw *tierWriter) writeProblem(w http.ResponseWriter, r *http.Request, d engine.Decision) {
	secs := headerfmt.CeilSeconds(d.RetryAfter)
	// omitempty fields, key-cap refusals and a key's own limit: leave the
	// rare cases to encoding/json.
	if secs <= 0 || d.Overflow || d.Limit != hw.policy.Limit {
		WriteProblem(w, r, Refusal{Policy: applied(hw.policy, d), Decision: d})
		return
	}
	bp := problemBufs.Get().(*[]byte)
	b := append((*bp)[:0], hw.problem.head...)
	b = strconv.AppendInt(b, secs, 10)
	b = append(b, hw.problem.mid...)
	b = strconv.AppendInt(b, secs, 10)
	b = append(b, `,"retry_after_ns":`...)
	b = strconv.AppendInt(b, int64(d.RetryAfter), 10)
	b = append(b, "}\n"...)
	h := w.Header()
	h["Content-Type"] = problemCT
	h["Content-Length"] = headerfmt.Int(int64(len(b)))
	h["X-Content-Type-Options"] = nosniff
	w.WriteHeader(problemStatus)
	_, _ = w.Write(b)
	*bp = b
	problemBufs.Put(bp)
}
