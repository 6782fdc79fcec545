package server

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/httpkit"
	"github.com/slidegate/slidegate/internal/server/config"
)

// groupRequest is a checked multi-limit request.
type groupRequest struct {
	refs     []engine.Ref
	policies []*policy // policies[i] is refs[i]'s
	cost     int
	tag      string
}

// resolveGroup checks a multi-limit request: every policy known, every
// key valid, no limit repeated, the cost within the smallest limit.
func (st *state) resolveGroup(req *AllowRequest) (groupRequest, error) {
	var g groupRequest
	if req.Key != "" || req.Policy != "" {
		return g, errors.New(`give either "key" and "policy" or "limits", not both`)
	}
	if len(req.Limits) == 0 {
		return g, errors.New(`"limits" is empty: name at least one {"policy", "key"}`)
	}
	if req.Tag != "" {
		if err := config.CheckKey(`"tag"`, req.Tag); err != nil {
			return g, err
		}
	}
	g.tag = req.Tag
	least := 0
	for i, l := range req.Limits {
		t, ok := st.byName[l.Policy]
		switch {
		case l.Policy == "":
			return g, fmt.Errorf(`limits[%d]: missing "policy"`, i)
		case !ok:
			return g, fmt.Errorf("limits[%d]: unknown policy %q", i, l.Policy)
		}
		if err := config.CheckKey(`"key"`, l.Key); err != nil {
			return g, fmt.Errorf("limits[%d]: %w", i, err)
		}
		for j, o := range req.Limits[:i] {
			if o == l {
				return g, fmt.Errorf("limits[%d] repeats limits[%d] (policy %q, the same key): a request counts once against one key", i, j, l.Policy)
			}
		}
		g.refs = append(g.refs, engine.Ref{Policy: t.index, Key: l.Key})
		g.policies = append(g.policies, t)
		// A key's override lowers the bound; the group keeps its
		// policies' (engine.Limiter.SetOverrides).
		if l := min(t.limitOf(l.Key), t.ep.Limit); i == 0 || l < least {
			least = l
		}
	}
	g.cost = 1
	if req.Cost != nil {
		g.cost = *req.Cost
	}
	if g.cost < 1 || g.cost > least {
		return g, fmt.Errorf("cost %d is outside 1..%d (the smallest limit of the request)", g.cost, least)
	}
	if st.group == nil && len(g.refs) > 1 {
		return g, errNoGroup
	}
	return g, nil
}

// errNoGroup answers a multi-limit request on a store without a group.
var errNoGroup = errors.New("this server's store cannot decide several limits at once: send one limit per request")

// decideGroup asks the state's group and observes the decision.
func (s *Server) decideGroup(r *http.Request, st *state, g groupRequest) (engine.GroupDecision, error) {
	var gb engine.GroupBackend = backendsGroup{st: st} // one limit: needs no group
	if st.group != nil {
		gb = st.group
	}
	start := time.Now()
	gd, err := gb.DecideGroup(r.Context(), nil, engine.GroupRequest{Refs: g.refs, N: g.cost, Tag: g.tag})
	lat := time.Since(start)
	if s.opts.tracing.Decision != nil {
		var d engine.Decision
		if err == nil {
			d = gd.Limits[gd.Binding]
		}
		s.traceDecision(r.Context(), "api", httplimit.Event{Policy: g.policies[min(gd.Binding, len(g.policies)-1)].name, Cost: g.cost, Decision: d, Latency: lat, Err: err})
	}
	if err != nil {
		s.observe(g.policies[0], engine.Decision{}, lat, err)
		return gd, err
	}
	if len(g.refs) == 1 {
		s.observe(g.policies[0], gd.Limits[0], lat, nil)
		if !gd.Allowed {
			s.noteRefusal(g.policies[0].name, g.refs[0].Key, g.cost)
		}
		return gd, nil
	}
	for _, t := range g.policies {
		observeLimit(t, gd.Allowed, lat)
	}
	if !gd.Allowed {
		b := gd.Binding
		s.noteRefusal(g.policies[b].name, g.refs[b].Key, g.cost)
	}
	return gd, nil
}

// handleGroup answers a multi-limit POST /v1/allow.
func (s *Server) handleGroup(st *state, w http.ResponseWriter, r *http.Request, req *AllowRequest, buf *bytes.Buffer) {
	g, err := st.resolveGroup(req)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errNoGroup) {
			status = http.StatusNotImplemented
		}
		s.fail(w, r, status, err)
		return
	}
	gd, err := s.decideGroup(r, st, g)
	if err != nil {
		s.backendFailed(w, r, err)
		return
	}
	h := w.Header()
	hws := make([]*httpkit.HeaderWriter, len(g.policies))
	for i, t := range g.policies {
		hws[i] = t.hw
	}
	httpkit.WriteLimits(h, hws, gd)
	out := appendGroup(buf.AvailableBuffer()[:0], g.policies, gd)
	out = append(out, '\n')
	h["Content-Type"] = jsonCT
	h["Content-Length"] = contentLength(len(out))
	status := http.StatusOK
	if !gd.Allowed {
		status = http.StatusTooManyRequests
	}
	w.WriteHeader(status)
	_, _ = w.Write(out)
}

// appendGroup renders a GroupResponse.
func appendGroup(b []byte, policies []*policy, gd engine.GroupDecision) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, gd.Allowed)
	b = append(b, `,"binding":`...)
	b = strconv.AppendInt(b, int64(gd.Binding), 10)
	b = append(b, `,"limits":[`...)
	for i, d := range gd.Limits {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendDecision(b, policies[i].name, d)
	}
	return append(b, ']', '}')
}
