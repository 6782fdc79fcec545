package httplimit

// Tier returns the header writer (and through it the backend) of a tier
// of one backend, "" naming the default; false for a multi-limit tier.
// Tests only.
func (m *Middleware) Tier(name string) (*HeaderWriter, bool) {
	if name == "" {
		return m.def, m.def != nil
	}
	hw, ok := m.tiers[name]
	return hw, ok
}
