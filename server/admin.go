package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/redact"
)

// Key operations for support staff, on the admin listener only:
//
//	GET    /admin/keys?policy=P&key=K   the key's state under policy P
//	DELETE /admin/keys?policy=P&key=K   drop it (the client starts afresh)
//
// An empty policy names the default policy. Every operation is logged
// (policy, key, outcome) and counted in slidegate_admin_key_operations_total.
// The key is bounded like every client key (httplimit.MaxKeyLen bytes,
// valid UTF-8). Backends that cannot do it (Redis today) answer 501.

// MetricAdminKeyOps counts the admin listener's key operations.
const MetricAdminKeyOps = "slidegate_admin_key_operations_total"

// keyStateJSON is the body of GET /admin/keys.
type keyStateJSON struct {
	Policy        string  `json:"policy"`
	Key           string  `json:"key"`
	Exists        bool    `json:"exists"`
	Limit         int     `json:"limit"`
	Used          int     `json:"used"`
	Remaining     int     `json:"remaining"`
	OldestSeconds float64 `json:"oldest_seconds"`
	ResetSeconds  float64 `json:"reset_seconds"`
}

func newAdminKeyOps(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricAdminKeyOps,
		Help: "Key operations on the admin listener, by operation (inspect, reset) and result (found, absent, error).",
	}, []string{"op", "result"})
	for _, op := range []string{"inspect", "reset"} {
		for _, res := range []string{"found", "absent", "error"} {
			c.WithLabelValues(op, res)
		}
	}
	if err := reg.Register(c); err != nil {
		return nil, fmt.Errorf("server: registering metrics: %w", err)
	}
	return c, nil
}

func (s *Server) adminKeys(w http.ResponseWriter, r *http.Request) {
	op := "inspect"
	if r.Method == http.MethodDelete {
		op = "reset"
	}
	q := r.URL.Query()
	policy, key := q.Get("policy"), q.Get("key")
	fail := func(status int, err error) {
		s.adminOps.WithLabelValues(op, "error").Inc()
		httplimit.WriteError(w, r, status, err)
	}
	switch {
	case !q.Has("key"):
		fail(http.StatusBadRequest, errors.New("the key parameter is required"))
		return
	case len(key) > httplimit.MaxKeyLen:
		fail(http.StatusBadRequest, fmt.Errorf("the key is %d bytes, more than %d", len(key), httplimit.MaxKeyLen))
		return
	case !utf8.ValidString(key) || !utf8.ValidString(policy):
		fail(http.StatusBadRequest, errors.New("the key and policy must be valid UTF-8"))
		return
	}
	b, ok := s.backend(policy)
	if !ok {
		fail(http.StatusNotFound, fmt.Errorf("no policy named %q", policy))
		return
	}
	ka, ok := b.(engine.KeyAdmin)
	if !ok {
		fail(http.StatusNotImplemented, errors.New("this store cannot inspect or reset keys"))
		return
	}
	p := b.Policy()
	if op == "reset" {
		had, err := ka.ResetKey(r.Context(), key)
		if err != nil {
			s.log.Warn("admin: reset key failed", "policy", p.Name, "key", redact.Key(key), "err", redact.URLs(err.Error()))
			fail(http.StatusServiceUnavailable, errors.New("the rate-limit store is unavailable"))
			return
		}
		s.log.Info("admin: key reset", "policy", p.Name, "key", redact.Key(key), "had_state", had, "remote", r.RemoteAddr)
		s.adminOps.WithLabelValues(op, found(had)).Inc()
		writeJSON(w, map[string]any{"policy": p.Name, "key": key, "reset": had})
		return
	}
	st, had, err := ka.InspectKey(r.Context(), key)
	if err != nil {
		s.log.Warn("admin: inspect key failed", "policy", p.Name, "key", redact.Key(key), "err", redact.URLs(err.Error()))
		fail(http.StatusServiceUnavailable, errors.New("the rate-limit store is unavailable"))
		return
	}
	s.log.Info("admin: key inspected", "policy", p.Name, "key", redact.Key(key), "has_state", had, "remote", r.RemoteAddr)
	s.adminOps.WithLabelValues(op, found(had)).Inc()
	body := keyStateJSON{Policy: p.Name, Key: key, Exists: had, Limit: p.Limit, Remaining: p.Limit}
	if had {
		body.Used, body.Remaining = st.Used, st.Remaining
		body.OldestSeconds, body.ResetSeconds = st.Oldest.Seconds(), st.Reset.Seconds()
	}
	writeJSON(w, body)
}

func found(had bool) string {
	if had {
		return "found"
	}
	return "absent"
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}
