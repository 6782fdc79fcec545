package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

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
}

// apiHandler serves the decision API on its routes; anything else is 404.
func (s *Server) apiHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/allow", s.handleAllow)
	mux.HandleFunc("/v1/allow/batch", s.handleBatch)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, http.StatusNotFound, fmt.Errorf("no route %s %s (the decision API is POST /v1/allow and POST /v1/allow/batch)", r.Method, r.URL.Path))
	})
	return mux
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	if status < 500 {
		s.metrics.bad.WithLabelValues(strconv.Itoa(status)).Inc()
	}
	httplimit.WriteError(w, r, status, err)
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// readBody reads at most MaxBodyBytes; it answers the request itself (405,
// 413, 400) and returns ok=false when it cannot.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, buf *bytes.Buffer) bool {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		s.fail(w, r, http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed: use POST with a JSON body", r.Method))
		return false
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			s.fail(w, r, http.StatusRequestEntityTooLarge, fmt.Errorf("request body exceeds max_body_bytes (%d bytes)", mbe.Limit))
			return false
		}
		s.fail(w, r, http.StatusBadRequest, fmt.Errorf("reading request body: %w", err))
		return false
	}
	return true
}

// decodeJSON decodes data into v strictly: unknown fields and trailing
// data are errors.
func decodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("malformed JSON: empty body")
		}
		return fmt.Errorf("malformed JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("malformed JSON: data after the value")
	}
	return nil
}

// resolve checks one request and returns its tier and cost.
func (s *Server) resolve(req *AllowRequest) (*tier, int, error) {
	t := s.def
	if req.Policy != "" {
		var ok bool
		if t, ok = s.byName[req.Policy]; !ok {
			return nil, 0, fmt.Errorf("unknown policy %q", req.Policy)
		}
	}
	if req.Key == "" {
		return nil, 0, errors.New(`missing "key" (a non-empty string)`)
	}
	if len(req.Key) > httplimit.MaxKeyLen {
		return nil, 0, fmt.Errorf(`"key" is longer than %d bytes`, httplimit.MaxKeyLen)
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

func (s *Server) handleAllow(w http.ResponseWriter, r *http.Request) {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer bufPool.Put(buf)
	if !s.readBody(w, r, buf) {
		return
	}
	var (
		req  AllowRequest
		cost int
	)
	if !parseAllowFast(buf.Bytes(), &req, &cost) {
		req = AllowRequest{}
		if err := decodeJSON(buf.Bytes(), &req); err != nil {
			s.fail(w, r, http.StatusBadRequest, err)
			return
		}
	}
	t, cost, err := s.resolve(&req)
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, err)
		return
	}
	d, err := s.decide(r, t, req.Key, cost)
	if err != nil {
		httplimit.WriteError(w, r, httplimit.StatusOf(err), err)
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

func (s *Server) handleBatch(w http.ResponseWriter, r *http.Request) {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer bufPool.Put(buf)
	if !s.readBody(w, r, buf) {
		return
	}
	var reqs []AllowRequest
	if err := decodeJSON(buf.Bytes(), &reqs); err != nil {
		s.fail(w, r, http.StatusBadRequest, fmt.Errorf("%w (want an array of {\"key\", \"policy\", \"cost\"})", err))
		return
	}
	if len(reqs) == 0 {
		s.fail(w, r, http.StatusBadRequest, errors.New("empty batch"))
		return
	}
	if len(reqs) > s.cfg.MaxBatch {
		s.fail(w, r, http.StatusRequestEntityTooLarge, fmt.Errorf("batch of %d items exceeds max_batch (%d)", len(reqs), s.cfg.MaxBatch))
		return
	}
	// Check every item before deciding any, so that a bad batch changes
	// nothing.
	tiers := make([]*tier, len(reqs))
	costs := make([]int, len(reqs))
	for i := range reqs {
		t, cost, err := s.resolve(&reqs[i])
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
			httplimit.WriteError(w, r, httplimit.StatusOf(err), fmt.Errorf("item %d: %w", i, err))
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
	return append(b, '}')
}
