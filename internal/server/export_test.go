package server

import "github.com/slidegate/slidegate/engine"

// Backend returns the backend of a policy ("" for the default policy) in
// the configuration in force. Tests only.
func (s *Server) Backend(policy string) (engine.Backend, bool) {
	t, ok := s.policyNamed(policy)
	if !ok {
		return nil, false
	}
	return t.backend, true
}

// StopTop turns the view of the keys refused most off, so that a
// benchmark can measure what it costs. Tests only.
func (s *Server) StopTop() { s.top.Close(); s.top = nil }

// SetTopBusy makes the view of the keys refused most take stripes of its
// counters as held by other requests (topk.Tracker.SetBusy), so that a
// benchmark can measure the contended paths. Tests only.
func (s *Server) SetTopBusy(level int) { s.top.SetBusy(level) }
