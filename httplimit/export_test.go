package httplimit

import "github.com/slidegate/slidegate/internal/httpkit"

// For the tests of package httplimit_test: the header writer the
// middleware and the server share (internal/httpkit).
type HeaderWriter = httpkit.HeaderWriter

var NewHeaderWriter = httpkit.NewHeaderWriter

// The Transport's defaults and the bound on a tier's limits, unexported.
const (
	DefaultMargin    = defaultMargin
	DefaultPause     = defaultPause
	MaxLimitsForTest = maxLimits
)

// Tier returns the header writer (and through it the backend) of a tier
// of one backend, "" naming the default; false for a multi-limit tier.
func (m *Middleware) Tier(name string) (*HeaderWriter, bool) {
	if name == "" {
		if m.def == nil {
			return nil, false
		}
		return m.def.HeaderWriter, true
	}
	hw, ok := m.tiers[name]
	if !ok {
		return nil, false
	}
	return hw.HeaderWriter, true
}
