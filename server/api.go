package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
)

// AllowRequest is the body of POST /v1/allow and one item of
// /v1/allow/batch. Policy "" means the default policy; a missing cost
// means 1.
type AllowRequest struct {
	Key    string `json:"key"`
	Policy string `json:"policy,omitempty"`
	Cost   *int   `json:"cost,omitempty"`
}

// AllowResponse is the JSON answer to one decision: every Decision field
// plus the policy name. Durations are given exactly in nanoseconds and,
// for convenience, in whole seconds rounded up (as the headers show them).
type AllowResponse struct {
	Allowed           bool   `json:"allowed"`
	Policy            string `json:"policy"`
	Limit             int    `json:"limit"`
	Remaining         int    `json:"remaining"`
	RetryAfterNs      int64  `json:"retry_after_ns"`
	ResetNs           int64  `json:"reset_ns"`
	At                int64  `json:"at"`
	RetryAfterSeconds int64  `json:"retry_after_seconds"`
	ResetSeconds      int64  `json:"reset_seconds"`
	// Overflow is true when the key was new and the policy already tracks
	// its max_keys keys: refused (429) with overflow "refuse", admitted
	// untracked with "allow".
	Overflow bool `json:"overflow,omitempty"`
}

// apiHandler serves the decision API of st on its routes; anything else
// is 404.
func (s *Server) apiHandler(st *state) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/allow", func(w http.ResponseWriter, r *http.Request) { s.handleAllow(st, w, r) })
	mux.HandleFunc("/v1/allow/batch", func(w http.ResponseWriter, r *http.Request) { s.handleBatch(st, w, r) })
	mux.HandleFunc("/v1/noop", handleNoop)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, http.StatusNotFound, fmt.Errorf("no route %s %s (the decision API is POST /v1/allow and POST /v1/allow/batch)", r.Method, r.URL.Path))
	})
	return mux
}

// handleNoop answers 204 after reading the body: the baseline the load
// test compares the decision API with, served by the same server.
func handleNoop(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, DefaultMaxBodyBytes))
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	if status < 500 {
		s.metrics.bad.WithLabelValues(strconv.Itoa(status)).Inc()
	}
	httplimit.WriteError(w, r, status, err)
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

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
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, st.cfg.MaxBodyBytes))
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

// errNotUTF8 explains why a body with invalid UTF-8 is refused.
var errNotUTF8 = errors.New("the body is not valid UTF-8: keys are compared byte for byte, and invalid bytes would make different keys equal")

// decodeAllow decodes one allow request strictly: field names exactly as
// documented (no case folding), no unknown fields, no trailing data, and
// errors that name the field at fault.
func decodeAllow(data []byte, req *AllowRequest) error {
	if !utf8.Valid(data) {
		return errNotUTF8
	}
	var raw json.RawMessage
	if err := decodeOne(data, &raw); err != nil {
		return err
	}
	return decodeItem(raw, req)
}

// decodeBatch decodes a batch strictly, as decodeAllow does each item.
func decodeBatch(data []byte) ([]AllowRequest, error) {
	if !utf8.Valid(data) {
		return nil, errNotUTF8
	}
	var raws []json.RawMessage
	if err := decodeOne(data, &raws); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, errors.New(`malformed JSON: want an array of {"key", "policy", "cost"} objects`)
		}
		return nil, err
	}
	reqs := make([]AllowRequest, len(raws))
	for i, raw := range raws {
		if err := decodeItem(raw, &reqs[i]); err != nil {
			return nil, fmt.Errorf("item %d: %w", i, err)
		}
	}
	return reqs, nil
}

// decodeOne decodes the single JSON value of data into v.
func decodeOne(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("malformed JSON: empty body")
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return err
		}
		return fmt.Errorf("malformed JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("malformed JSON: data after the value")
	}
	return nil
}

// decodeItem decodes one {"key", "policy", "cost"} object; a repeated
// field takes its last value, as in the fast path.
func decodeItem(raw json.RawMessage, req *AllowRequest) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return errors.New(`malformed JSON: want an object {"key", "policy", "cost"}`)
	}
	for name, v := range fields {
		switch name {
		case "key":
			if err := json.Unmarshal(v, &req.Key); err != nil {
				return errors.New(`malformed JSON: "key" must be a string`)
			}
		case "policy":
			if err := json.Unmarshal(v, &req.Policy); err != nil {
				return errors.New(`malformed JSON: "policy" must be a string`)
			}
		case "cost":
			if string(v) == "null" {
				req.Cost = nil
				continue
			}
			var n int
			if err := json.Unmarshal(v, &n); err != nil {
				return fmt.Errorf(`malformed JSON: "cost" must be a whole number, not %.20s`, v)
			}
			req.Cost = &n
		default:
			return fmt.Errorf(`malformed JSON: unknown field %q (the fields are "key", "policy" and "cost", in lower case)`, name)
		}
	}
	return nil
}

// resolve checks one request and returns its tier and cost.
func (st *state) resolve(req *AllowRequest) (*tier, int, error) {
	t := st.def
	if req.Policy != "" {
		var ok bool
		if t, ok = st.byName[req.Policy]; !ok {
			return nil, 0, fmt.Errorf("unknown policy %q", req.Policy)
		}
	}
	if req.Key == "" {
		return nil, 0, errors.New(`missing "key" (a non-empty string)`)
	}
	if len(req.Key) > httplimit.MaxKeyLen {
		return nil, 0, fmt.Errorf(`"key" is longer than %d bytes`, httplimit.MaxKeyLen)
	}
	if strings.ContainsRune(req.Key, utf8.RuneError) {
		return nil, 0, errors.New(`"key" holds invalid UTF-8 (an unpaired surrogate escape or U+FFFD, the replacement character): different keys would be counted as one`)
	}
	cost := 1
	if req.Cost != nil {
		cost = *req.Cost
	}
	if cost < 1 || cost > t.policy.Limit {
		return nil, 0, fmt.Errorf("cost %d is outside 1..%d (the limit of policy %q)", cost, t.policy.Limit, t.name)
	}
	return t, cost, nil
}

// decide asks t's backend and observes the decision.
func (s *Server) decide(r *http.Request, t *tier, key string, cost int) (engine.Decision, error) {
	start := time.Now()
	d, err := t.backend.Decide(r.Context(), key, cost)
	s.observe(t, key, cost, d, time.Since(start), err)
	return d, err
}

func (s *Server) handleAllow(st *state, w http.ResponseWriter, r *http.Request) {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer bufPool.Put(buf)
	if !s.readBody(st, w, r, buf) {
		return
	}
	var (
		req  AllowRequest
		cost int
	)
	if !parseAllowFast(buf.Bytes(), &req, &cost) {
		req = AllowRequest{}
		if err := decodeAllow(buf.Bytes(), &req); err != nil {
			s.fail(w, r, http.StatusBadRequest, err)
			return
		}
	}
	t, cost, err := st.resolve(&req)
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, err)
		return
	}
	d, err := s.decide(r, t, req.Key, cost)
	if err != nil {
		s.backendFailed(w, r, err)
		return
	}
	h := w.Header()
	t.hw.Write(h, d)
	out := appendDecision(buf.AvailableBuffer()[:0], t.name, d)
	out = append(out, '\n')
	h["Content-Type"] = jsonCT
	h["Content-Length"] = contentLength(len(out))
	status := http.StatusOK
	if !d.Allowed {
		status = http.StatusTooManyRequests
	}
	w.WriteHeader(status)
	_, _ = w.Write(out)
}

var jsonCT = []string{"application/json"}

// lengths are pre-rendered Content-Length values for decision bodies;
// like the httplimit header slices, they are shared and never written.
var lengths = func() [][]string {
	out := make([][]string, 512)
	for i := range out {
		out[i] = []string{strconv.Itoa(i)}
	}
	return out
}()

func contentLength(n int) []string {
	if n < len(lengths) {
		return lengths[n]
	}
	return []string{strconv.Itoa(n)}
}

// BatchResponse is the answer to POST /v1/allow/batch: one item per
// request item, in order.
type BatchResponse = []AllowResponse

func (s *Server) handleBatch(st *state, w http.ResponseWriter, r *http.Request) {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer bufPool.Put(buf)
	if !s.readBody(st, w, r, buf) {
		return
	}
	reqs, err := decodeBatch(buf.Bytes())
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if len(reqs) == 0 {
		s.fail(w, r, http.StatusBadRequest, errors.New("empty batch"))
		return
	}
	if len(reqs) > st.cfg.MaxBatch {
		s.fail(w, r, http.StatusRequestEntityTooLarge, fmt.Errorf("batch of %d items exceeds max_batch (%d)", len(reqs), st.cfg.MaxBatch))
		return
	}
	// Check every item before deciding any, so that a bad batch changes
	// nothing.
	tiers := make([]*tier, len(reqs))
	costs := make([]int, len(reqs))
	for i := range reqs {
		t, cost, err := st.resolve(&reqs[i])
		if err != nil {
			s.fail(w, r, http.StatusBadRequest, fmt.Errorf("item %d: %w", i, err))
			return
		}
		tiers[i], costs[i] = t, cost
	}
	out := make([]byte, 0, 192*len(reqs))
	out = append(out, '[')
	for i := range reqs {
		d, err := s.decide(r, tiers[i], reqs[i].Key, costs[i])
		if err != nil {
			s.backendFailed(w, r, fmt.Errorf("item %d: %w", i, err))
			return
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = appendDecision(out, tiers[i].name, d)
	}
	out = append(out, ']', '\n')
	h := w.Header()
	h["Content-Type"] = jsonCT
	h["Content-Length"] = []string{strconv.Itoa(len(out))}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}

// appendDecision renders an AllowResponse by hand: it is the hot path of
// the decision API, and policy names need no escaping (Config.Validate
// restricts them to letters, digits, '.', '_' and '-').
func appendDecision(b []byte, policy string, d engine.Decision) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, d.Allowed)
	b = append(b, `,"policy":"`...)
	b = append(b, policy...)
	b = append(b, `","limit":`...)
	b = strconv.AppendInt(b, int64(d.Limit), 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, int64(d.Remaining), 10)
	b = append(b, `,"retry_after_ns":`...)
	b = strconv.AppendInt(b, int64(d.RetryAfter), 10)
	b = append(b, `,"reset_ns":`...)
	b = strconv.AppendInt(b, int64(d.Reset), 10)
	b = append(b, `,"at":`...)
	b = strconv.AppendInt(b, d.At, 10)
	b = append(b, `,"retry_after_seconds":`...)
	b = strconv.AppendInt(b, httplimit.RetryAfterSeconds(d), 10)
	b = append(b, `,"reset_seconds":`...)
	b = strconv.AppendInt(b, httplimit.ResetSeconds(d), 10)
	if d.Overflow {
		b = append(b, `,"overflow":true`...)
	}
	return append(b, '}')
}
