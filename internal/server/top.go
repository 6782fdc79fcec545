package server

import (
	"net/http"

	"github.com/slidegate/slidegate/internal/redact"
	"github.com/slidegate/slidegate/internal/topk"
)

// Defaults of the view of the keys refused most (GET /admin/top).
const (
	// DefaultTopCounters is top_counters' default: counters per minute
	// over every policy (internal/topk states the error).
	DefaultTopCounters = topk.DefaultCounters
	// MaxTopCounters bounds top_counters. A counter takes 196 bytes
	// (room for two: 56 bytes each, four 16-byte index cells, two 8-byte
	// counts to sort, 32 bits of the door), so 65,536 of them in each of
	// the five minutes come to 64 MB, plus the keys.
	MaxTopCounters = 1 << 16
)

// noteRefusal counts a refusal of key by the named policy for the view
// of the keys refused most. key may be a view of a request buffer.
func (s *Server) noteRefusal(policy, key string, cost int) {
	if s.top != nil {
		s.top.Record(policy, key, cost)
	}
}

// adminTop answers GET /admin/top?policy=NAME&n=N: the keys refused most
// in the window, of one policy or of every policy.
func (s *Server) adminTop() http.HandlerFunc {
	show := redact.Key
	if s.cfg.TopRawKeys {
		show = nil
	}
	known := func(name string) bool { return s.cur.Load().byName[name] != nil }
	return topk.Handler(s.top, "policy", known, show, s.fail)
}
