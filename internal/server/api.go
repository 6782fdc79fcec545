package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/bits"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/headerfmt"
	"github.com/slidegate/slidegate/internal/httpkit"
	"github.com/slidegate/slidegate/internal/redact"
	"github.com/slidegate/slidegate/internal/server/config"
)

// AllowRequest is the body of POST /v1/allow and one item of
// /v1/allow/batch. Policy "" means the default policy; a missing cost
// means 1. A request over several limits at once gives Limits instead of
// Key and Policy: it is allowed only if every limit has room, and a
// refusal by any of them charges none.
type AllowRequest struct {
	Key    string         `json:"key,omitempty"`
	Policy string         `json:"policy,omitempty"`
	Cost   *int           `json:"cost,omitempty"`
	Limits []LimitRequest `json:"limits,omitempty"`
	// Tag, with Limits, places every key of the request in one partition
	// of a store that keeps keys in partitions (Redis Cluster), so that one
	// atomic call decides them; it is needed there when the limits' keys
	// differ, and ignored by other stores. At most httplimit.MaxKeyLen
	// bytes.
	Tag string `json:"tag,omitempty"`
}

// LimitRequest is one limit of a multi-limit AllowRequest: a policy (by
// name; required) and the key counted against it.
type LimitRequest struct {
	Policy string `json:"policy"`
	Key    string `json:"key"`
}

// GroupResponse is the JSON answer to a multi-limit request: whether it
// was allowed, each limit's decision in the request's order (all made at
// one instant), and the index of the binding limit, the one the headers
// report: for a refusal the refusing limit with the longest retry, else
// the limit with the least remaining.
type GroupResponse struct {
	Allowed bool            `json:"allowed"`
	Binding int             `json:"binding"`
	Limits  []AllowResponse `json:"limits"`
}

// AllowResponse is the JSON answer to one decision: every Decision field
// plus the policy name (httpkit's type, which package remote reads).
type AllowResponse = httpkit.AllowResponse

// apiHandler serves the decision API of st on its routes, and the check
// endpoint for proxies (check.go); anything else is 404.
func (s *Server) apiHandler(st *state) (http.Handler, error) {
	check, err := s.checkHandler(st)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc(allowPath, func(w http.ResponseWriter, r *http.Request) { s.handleAllow(st, w, r) })
	mux.HandleFunc("/v1/allow/batch", func(w http.ResponseWriter, r *http.Request) { s.handleBatch(st, w, r) })
	mux.Handle(CheckPath, check)
	mux.Handle(CheckPath+"/", check)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, http.StatusNotFound, fmt.Errorf("no route %s %s (the decision API is POST /v1/allow and POST /v1/allow/batch; proxies ask /v1/check)", r.Method, r.URL.Path))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The decision API's own path, sent as is, goes straight to its
		// handler: the mux's lookup (path cleaning, escaping, pattern
		// matching) cost more CPU than parsing the body. Anything else,
		// an escaped path included, takes the mux as before.
		if r.URL.Path == allowPath && r.URL.RawPath == "" && r.Method != http.MethodConnect {
			r.Pattern = allowPath
			s.handleAllow(st, w, r)
			return
		}
		mux.ServeHTTP(w, r)
	}), nil
}

// allowPath is the decision API's path.
const allowPath = "/v1/allow"

func (s *Server) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	if status < 500 {
		s.metrics.bad.WithLabelValues(strconv.Itoa(status)).Inc()
	}
	httplimit.WriteError(w, r, status, err)
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// pooledBody reads r's body (readBody) into a buffer of bufPool, which
// the caller puts back once done with its bytes; nil when readBody
// answered the request itself.
func (s *Server) pooledBody(st *state, w http.ResponseWriter, r *http.Request) *bytes.Buffer {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	if !s.readBody(st, w, r, buf) {
		bufPool.Put(buf)
		return nil
	}
	return buf
}

// readBody reads at most max_body_bytes of a POST with a JSON body; it
// answers the request itself (405, 415, 413, 400) and returns ok=false
// when it cannot. Requiring application/json keeps a browser's
// cross-site form or text/plain POST, which needs no CORS preflight, from
// spending a key's quota.
func (s *Server) readBody(st *state, w http.ResponseWriter, r *http.Request, buf *bytes.Buffer) bool {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		s.fail(w, r, http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed: use POST with a JSON body", r.Method))
		return false
	}
	if !isJSON(r.Header["Content-Type"]) {
		w.Header().Set("Accept-Post", "application/json")
		s.fail(w, r, http.StatusUnsupportedMediaType, errors.New("the body must be sent with Content-Type: application/json"))
		return false
	}
	limit := int64(st.cfg.MaxBodyBytes)
	var err error
	if n := r.ContentLength; n >= 0 && n <= limit {
		// A body whose Content-Length is within the bound, the common
		// case, is read without http.MaxBytesReader, which allocates;
		// readAtMost still enforces the bound.
		var within bool
		if within, err = readAtMost(buf, r.Body, limit); err == nil && !within {
			w.Header().Set("Connection", "close") // as http.MaxBytesReader does
			err = &http.MaxBytesError{Limit: limit}
		} else if err == nil {
			// The body was read to its end: closing it tells net/http so,
			// which otherwise reads it again for its end (io.CopyN through
			// a LimitReader it allocates) before it writes the answer.
			_ = r.Body.Close()
		}
	} else {
		_, err = buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	}
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			s.fail(w, r, http.StatusRequestEntityTooLarge, fmt.Errorf("request body exceeds max_body_bytes (%d bytes)", mbe.Limit))
			return false
		}
		s.fail(w, r, http.StatusBadRequest, errors.New("reading the request body failed"))
		return false
	}
	return true
}

// readAtMost reads body to its end into buf, or until buf holds more than
// limit bytes: within is false then.
func readAtMost(buf *bytes.Buffer, body io.Reader, limit int64) (within bool, err error) {
	for int64(buf.Len()) <= limit {
		buf.Grow(bytes.MinRead)
		b := buf.AvailableBuffer()
		b = b[:min(int64(cap(b)), limit+1-int64(buf.Len()))]
		n, err := body.Read(b)
		buf.Write(b[:n])
		if err == io.EOF {
			return int64(buf.Len()) <= limit, nil
		}
		if err != nil {
			return true, err
		}
	}
	return false, nil
}

// isJSON reports whether a request's Content-Type values name
// application/json (parameters such as charset allowed).
func isJSON(v []string) bool {
	if len(v) != 1 {
		return false
	}
	if v[0] == "application/json" { // the common case, without parsing
		return true
	}
	mt, _, err := mime.ParseMediaType(v[0])
	return err == nil && mt == "application/json"
}

// resolveKnown checks one request of the given cost (req.Cost is not
// read) and returns its policy: known when not nil (req.Policy's policy,
// which the fast path looked up already), else req.Policy's. ascii says
// that the fast path took req.Key (checkRequestKey).
func (st *state) resolveKnown(req *AllowRequest, known *policy, cost int, ascii bool) (*policy, error) {
	if req.Tag != "" {
		return nil, errors.New(`"tag" goes with "limits": one limit needs no tag`)
	}
	t := known
	if t == nil {
		t = st.def
		if req.Policy != "" {
			var ok bool
			if t, ok = st.byName[req.Policy]; !ok {
				return nil, fmt.Errorf("unknown policy %q", req.Policy)
			}
		}
	}
	if err := checkRequestKey(req.Key, ascii); err != nil {
		return nil, err
	}
	if l := t.limitOf(req.Key); cost < 1 || cost > l {
		return nil, fmt.Errorf("cost %d is outside 1..%d (the limit of policy %q for this key)", cost, l, t.name)
	}
	return t, nil
}

// checkRequestKey is config.CheckKey for a request's "key". A key the
// fast path took (ascii) holds printable ASCII only (plainString), so it
// cannot hold U+FFFD: CheckKey's scan of every byte for it is skipped.
// Any key that fails a check still gets CheckKey's error.
func checkRequestKey(key string, ascii bool) error {
	if ascii && key != "" && len(key) <= httplimit.MaxKeyLen {
		return nil
	}
	return config.CheckKey(`"key"`, key)
}

// limitOf returns the limit t applies to key: its override's, or the
// policy's.
func (t *policy) limitOf(key string) int {
	if t.limits == nil {
		return t.ep.Limit // no lookup: a nil map's costs a call
	}
	if l, ok := t.limits[key]; ok {
		return l
	}
	return t.ep.Limit
}

// decide asks t's backend and observes the decision.
func (s *Server) decide(r *http.Request, t *policy, key string, cost int) (engine.Decision, error) {
	start := sinceEpoch()
	d, err := t.backend.Decide(r.Context(), key, cost)
	lat := sinceEpoch() - start
	s.observe(t, d, lat, err)
	s.traceDecision(r.Context(), "api", httplimit.Event{Policy: t.name, Cost: cost, Decision: d, Latency: lat, Err: err})
	if err == nil && !d.Allowed {
		s.noteRefusal(t.name, key, cost)
	}
	return d, err
}

// decodeAllowBody decodes an allow request's body into req and returns
// its cost: by the fast path when it can (parseAllowFast), else by the
// strict decoder (decodeAllow), whose error it returns. known is the
// policy the fast path found for req.Policy (nil otherwise); view says
// that req.Key is a view of b. The common request allocates nothing: req
// stays on the caller's stack, the fast path's cost in a local (a pointer
// to a local stored in req would move it to the heap), and the fallback
// decodes into a request of its own (encoding/json makes any request it
// is handed escape), copied into req.
func decodeAllowBody(b []byte, byName map[string]*policy, req *AllowRequest) (cost int, known *policy, view bool, err error) {
	cost = 1
	known, ok, _ := parseAllowFast(b, byName, req, &cost)
	if ok {
		return cost, known, true, nil
	}
	slow := new(AllowRequest)
	if err := decodeAllow(b, slow); err != nil {
		return 0, nil, false, err
	}
	*req, cost = *slow, 1 // the fast path may have set cost before it gave up
	if req.Cost != nil {
		cost = *req.Cost
	}
	return cost, nil, false, nil
}

// decodeBatchBody decodes a batch body: by the fast path when it can
// (parseBatchFast), else by the strict decoder (decodeBatch), whose error
// it returns. view says that the items' keys are views of b.
func decodeBatchBody(b []byte, byName map[string]*policy) (items []batchItem, view bool, err error) {
	if items, ok := parseBatchFast(b, byName, nil); ok {
		return items, true, nil
	}
	reqs, err := decodeBatch(b)
	if err != nil {
		return nil, false, err
	}
	items = make([]batchItem, len(reqs))
	for i := range reqs {
		items[i].req, items[i].cost = reqs[i], 1
		if reqs[i].Cost != nil {
			items[i].cost = *reqs[i].Cost
		}
	}
	return items, false, nil
}

// epoch is the origin of sinceEpoch.
var epoch = time.Now()

// sinceEpoch is the monotonic time since epoch: a decision's latency is
// the difference of two, which reads the monotonic clock only (time.Now
// reads the wall clock too).
func sinceEpoch() time.Duration { return time.Since(epoch) }

func (s *Server) handleAllow(st *state, w http.ResponseWriter, r *http.Request) {
	buf := s.pooledBody(st, w, r)
	if buf == nil {
		return
	}
	defer bufPool.Put(buf)
	var req AllowRequest // on the stack: see decodeAllowBody
	cost, known, view, err := decodeAllowBody(buf.Bytes(), st.byName, &req)
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if req.Limits != nil { // only the fallback decodes "limits"
		s.handleGroup(st, w, r, &req, buf)
		return
	}
	t, err := st.resolveKnown(&req, known, cost, view)
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, err)
		return
	}
	key := req.Key
	if view && !t.borrowsKey {
		key = strings.Clone(key) // buf goes back to bufPool when this returns
	}
	d, err := s.decide(r, t, key, cost)
	if err != nil {
		s.backendFailed(w, r, err)
		return
	}
	h := w.Header()
	t.hw.Write(h, d)
	out := appendDecision(buf.AvailableBuffer()[:0], t.name, d)
	out = append(out, '\n')
	// No Content-Length in the map: net/http sets it (without a map
	// entry to copy and sort) for a body the handler has finished within
	// its 2 KiB buffer, and a decision's is under 400 bytes.
	h["Content-Type"] = jsonCT
	status := http.StatusOK
	if !d.Allowed {
		status = http.StatusTooManyRequests
	}
	w.WriteHeader(status)
	_, _ = w.Write(out)
}

var jsonCT = []string{"application/json"}

// contentLength is the Content-Length value of a decision body: shared
// and never written, like the httplimit header slices.
func contentLength(n int) []string { return headerfmt.Int(int64(n)) }

// BatchResponse is the answer to POST /v1/allow/batch: one item per
// request item, in order.
type BatchResponse = []AllowResponse

func (s *Server) handleBatch(st *state, w http.ResponseWriter, r *http.Request) {
	buf := s.pooledBody(st, w, r)
	if buf == nil {
		return
	}
	defer bufPool.Put(buf)
	reqs, view, err := decodeBatchBody(buf.Bytes(), st.byName)
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if len(reqs) == 0 {
		s.fail(w, r, http.StatusBadRequest, errors.New("empty batch"))
		return
	}
	if len(reqs) > int(st.cfg.MaxBatch) {
		s.fail(w, r, http.StatusRequestEntityTooLarge, fmt.Errorf("batch of %d items exceeds max_batch (%d)", len(reqs), st.cfg.MaxBatch))
		return
	}
	// Check every item before deciding any, so that a bad batch changes
	// nothing.
	type item struct {
		t     *policy
		cost  int
		group *groupRequest
	}
	items := make([]item, len(reqs))
	for i := range reqs {
		req := &reqs[i].req
		if req.Limits != nil {
			g, err := st.resolveGroup(req)
			if err != nil {
				status := http.StatusBadRequest
				if errors.Is(err, errNoGroup) {
					status = http.StatusNotImplemented
				}
				s.fail(w, r, status, fmt.Errorf("item %d: %w", i, err))
				return
			}
			items[i].group = &g
			continue
		}
		t, err := st.resolveKnown(req, reqs[i].known, reqs[i].cost, view)
		if err != nil {
			s.fail(w, r, http.StatusBadRequest, fmt.Errorf("item %d: %w", i, err))
			return
		}
		items[i].t, items[i].cost = t, reqs[i].cost
	}
	out := make([]byte, 0, 192*len(reqs))
	out = append(out, '[')
	for i, it := range items {
		if i > 0 {
			out = append(out, ',')
		}
		var err error
		if it.group != nil {
			var gd engine.GroupDecision
			if gd, err = s.decideGroup(r, st, *it.group); err == nil {
				out = appendGroup(out, it.group.policies, gd)
			}
		} else {
			key := reqs[i].req.Key
			if view && !it.t.borrowsKey {
				key = strings.Clone(key) // buf goes back to bufPool when this returns
			}
			var d engine.Decision
			if d, err = s.decide(r, it.t, key, it.cost); err == nil {
				out = appendDecision(out, it.t.name, d)
			}
		}
		if err != nil {
			s.batchFailed(w, r, i, out[:len(out)-min(i, 1)], err)
			return
		}
	}
	out = append(out, ']', '\n')
	h := w.Header()
	h["Content-Type"] = jsonCT
	h["Content-Length"] = []string{strconv.Itoa(len(out))}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}

// batchFailed answers a batch whose item i the store failed to decide.
// Items are decided in order and the batch stops there, so the answer
// says exactly what was charged: the items before i, as their decisions
// (decided, a JSON array's opening and items) say; not item i (unless a
// remote store applied it and then failed to answer) and none after it.
func (s *Server) batchFailed(w http.ResponseWriter, r *http.Request, i int, decided []byte, err error) {
	status := httpkit.StatusOf(err)
	detail := "the rate-limit store is unavailable"
	switch {
	case status < 500:
		detail = err.Error()
	case status == http.StatusGatewayTimeout:
		detail = "the rate-limit store did not answer in time"
	}
	if status >= 500 {
		e := redact.URLs(err.Error())
		s.flood.Log(slog.LevelWarn, failureCause(detail, status, e), detail, "status", status, "method", r.Method, "path", r.URL.Path, "item", i, "err", e)
	}
	if i == 0 {
		detail = fmt.Sprintf("item 0: %s; no item was decided", detail)
	} else {
		detail = fmt.Sprintf("item %d: %s; items 0 to %d were decided (see decided: the allowed ones were charged), item %d and the rest were not", i, detail, i-1, i)
	}
	b, _ := json.Marshal(httplimit.Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail, Error: detail})
	out := append(b[:len(b)-1], `,"failed_item":`...)
	out = strconv.AppendInt(out, int64(i), 10)
	out = append(out, `,"decided":`...)
	out = append(out, decided...)
	out = append(out, ']', '}', '\n')
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(out)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(out)
}

// appendDecision renders an AllowResponse by hand: it is the hot path of
// the decision API, and policy names need no escaping (Config.Validate
// restricts them to letters, digits, '.', '_' and '-'). Its bytes are
// encoding/json's (TestAppendDecisionAsJSON); each literal run is one
// append, and the numbers take appendInt.
func appendDecision(b []byte, policy string, d engine.Decision) []byte {
	if d.Allowed {
		b = append(b, `{"allowed":true,"policy":"`...)
	} else {
		b = append(b, `{"allowed":false,"policy":"`...)
	}
	b = append(b, policy...)
	b = append(b, `","limit":`...)
	b = appendInt(b, int64(d.Limit))
	b = append(b, `,"remaining":`...)
	b = appendInt(b, int64(d.Remaining))
	b = append(b, `,"retry_after_ns":`...)
	b = appendInt(b, int64(d.RetryAfter))
	b = append(b, `,"reset_ns":`...)
	b = appendInt(b, int64(d.Reset))
	b = append(b, `,"at":`...)
	b = appendInt(b, d.At)
	b = append(b, `,"retry_after_seconds":`...)
	b = appendInt(b, headerfmt.CeilSeconds(d.RetryAfter))
	b = append(b, `,"reset_seconds":`...)
	b = appendInt(b, headerfmt.CeilSeconds(d.Reset))
	if d.Overflow {
		return append(b, `,"overflow":true}`...)
	}
	return append(b, '}')
}

// digitPairs holds "00" to "99".
const digitPairs = "00010203040506070809" +
	"10111213141516171819" +
	"20212223242526272829" +
	"30313233343536373839" +
	"40414243444546474849" +
	"50515253545556575859" +
	"60616263646566676869" +
	"70717273747576777879" +
	"80818283848586878889" +
	"90919293949596979899"

// pow10 holds the powers of ten an int64 reaches.
var pow10 = [...]uint64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19}

// appendInt appends n in decimal, as strconv.AppendInt(b, n, 10) does.
// A decision's numbers are never negative, and strconv's general path
// (three calls, a base switch) cost more than the digits: this one
// writes two digits a step into b's own spare capacity.
func appendInt(b []byte, n int64) []byte {
	if n < 10 {
		if n < 0 {
			return strconv.AppendInt(b, n, 10)
		}
		return append(b, byte('0'+n))
	}
	u := uint64(n)
	w := bits.Len64(u) * 1233 >> 12 // log10(u) or one less
	if u >= pow10[w] {
		w++
	}
	b = slices.Grow(b, w)
	out := b[len(b) : len(b)+w]
	i := w
	for u >= 100 {
		q := u / 100
		r := (u - q*100) * 2
		i -= 2
		out[i], out[i+1] = digitPairs[r], digitPairs[r+1]
		u = q
	}
	if u >= 10 {
		r := u * 2
		out[i-2], out[i-1] = digitPairs[r], digitPairs[r+1]
	} else {
		out[i-1] = byte('0' + u)
	}
	return b[:len(b)+w]
}
