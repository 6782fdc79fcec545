package countererror

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"
)

// Request is one request of a trace: key asks for cost at instant At
// (nanoseconds from the limiters' epoch).
type Request struct {
	Key  string
	At   int64
	Cost int
}

// Config sizes the traces Scenarios builds.
type Config struct {
	Limit   int           // L, ≥ 1
	Window  time.Duration // W, > 0; at least 100 ns so that the bands below are distinct
	Keys    int           // independent keys per scenario, ≥ 1
	Windows int           // windows of traffic per key, ≥ 2
	Seed    uint64        // traces are a pure function of Config
}

// Defaults for Config, used by cmd/countererror's flags.
const (
	DefaultLimit   = 100
	DefaultWindow  = time.Minute
	DefaultKeys    = 50
	DefaultWindows = 60
	DefaultSeed    = 1
)

// DefaultConfig returns the configuration docs/algorithms.md's table was
// made with.
func DefaultConfig() Config {
	return Config{Limit: DefaultLimit, Window: DefaultWindow, Keys: DefaultKeys, Windows: DefaultWindows, Seed: DefaultSeed}
}

// maxRequests bounds one scenario's trace, so that a typo in a flag fails
// with an error instead of exhausting memory.
const maxRequests = 50_000_000

// ErrInvalidConfig is returned for a Config outside the documented ranges.
var ErrInvalidConfig = errors.New("countererror: invalid config")

// Validate reports whether c is usable, with an error naming the field.
func (c Config) Validate() error {
	switch {
	case c.Limit < 1 || c.Limit > 1<<20:
		return fmt.Errorf("%w: limit %d must be in 1..%d", ErrInvalidConfig, c.Limit, 1<<20)
	case c.Window < 100 || c.Window > 366*24*time.Hour:
		return fmt.Errorf("%w: window %v must be in 100ns..8784h", ErrInvalidConfig, c.Window)
	case c.Keys < 1:
		return fmt.Errorf("%w: keys %d must be at least 1", ErrInvalidConfig, c.Keys)
	case c.Windows < 2:
		return fmt.Errorf("%w: windows %d must be at least 2", ErrInvalidConfig, c.Windows)
	}
	// The densest scenario sends 4L per window per key.
	if est := 4 * float64(c.Limit) * float64(c.Keys) * float64(c.Windows); est > maxRequests {
		return fmt.Errorf("%w: size limit×keys×windows too large (about %.0f requests per scenario, at most %d)", ErrInvalidConfig, est, maxRequests)
	}
	return nil
}

// Scenario is a named traffic pattern.
type Scenario struct {
	Name        string
	Description string
	// Trace returns the requests of all keys, sorted by At (stable across
	// keys). It is deterministic for a given Config.
	Trace func(Config) []Request
}

// Scenarios returns the traffic patterns the error table covers, in table
// order.
func Scenarios() []Scenario {
	return []Scenario{
		{Name: "poisson-0.5L", Description: "Poisson arrivals at half the limit (0.5·L per W)", Trace: poisson(0.5)},
		{Name: "poisson-0.8L", Description: "Poisson arrivals somewhat below the limit (0.8·L per W)", Trace: poisson(0.8)},
		{Name: "poisson-1.0L", Description: "Poisson arrivals at the limit (L per W)", Trace: poisson(1.0)},
		{Name: "poisson-1.5L", Description: "Poisson arrivals above the limit (1.5·L per W)", Trace: poisson(1.5)},
		{Name: "poisson-4L", Description: "Poisson arrivals far above the limit (4·L per W)", Trace: poisson(4)},
		{Name: "burst-end", Description: "L requests at uniform instants in the last 5% of every window", Trace: burst(0.95, 1.0, 1)},
		{Name: "burst-start", Description: "L requests at uniform instants in the first 5% of every window", Trace: burst(0, 0.05, 1)},
		{Name: "straddle", Description: "attacker: 2·L requests at uniform instants within ±W/20 of every window boundary", Trace: straddle},
		{Name: "worst-case", Description: "the constructed worst case, repeated: L at the last ns of a window, L at the last-but-one ns of the next", Trace: worstRepeated},
	}
}

func (c Config) key(i int) string { return "k" + strconv.Itoa(i) }

func (c Config) rng(salt uint64) *rand.Rand {
	return rand.New(rand.NewPCG(c.Seed, salt))
}

// merge sorts per-key requests into one trace ordered by instant.
func merge(reqs []Request) []Request {
	slices.SortStableFunc(reqs, func(a, b Request) int { return cmp.Compare(a.At, b.At) })
	return reqs
}

// poisson returns a scenario of Poisson arrivals at rate factor·L per W.
func poisson(factor float64) func(Config) []Request {
	return func(c Config) []Request {
		end := float64(c.Window) * float64(c.Windows)
		mean := float64(c.Window) / (factor * float64(c.Limit)) // ns between arrivals
		var reqs []Request
		for k := range c.Keys {
			r := c.rng(uint64(k)<<8 | uint64(factor*16))
			key := c.key(k)
			for t := r.ExpFloat64() * mean; t < end; t += r.ExpFloat64() * mean {
				reqs = append(reqs, Request{Key: key, At: int64(t), Cost: 1})
			}
		}
		return merge(reqs)
	}
}

// burst returns a scenario of mult·L requests per window at uniform
// instants in [from·W, to·W) of every window.
func burst(from, to float64, mult int) func(Config) []Request {
	return func(c Config) []Request {
		w := int64(c.Window)
		lo, hi := int64(from*float64(w)), int64(to*float64(w))
		var reqs []Request
		for k := range c.Keys {
			r := c.rng(uint64(k)<<8 | uint64(from*100)<<1 | 1)
			key := c.key(k)
			for j := range int64(c.Windows) {
				for range mult * c.Limit {
					reqs = append(reqs, Request{Key: key, At: j*w + lo + r.Int64N(hi-lo), Cost: 1})
				}
			}
		}
		return merge(reqs)
	}
}

// straddle sends 2·L requests at uniform instants in [jW − W/20, jW + W/20)
// around every window boundary jW (j ≥ 1).
func straddle(c Config) []Request {
	w := int64(c.Window)
	band := w / 20
	var reqs []Request
	for k := range c.Keys {
		r := c.rng(uint64(k)<<8 | 0x77)
		key := c.key(k)
		for j := int64(1); j < int64(c.Windows); j++ {
			for range 2 * c.Limit {
				reqs = append(reqs, Request{Key: key, At: j*w - band + r.Int64N(2*band), Cost: 1})
			}
		}
	}
	return merge(reqs)
}

// worstRepeated repeats the worst-case construction (see WorstCase) every
// two windows: L unit requests at the last nanosecond of window 2i+1 and L
// at the last-but-one nanosecond of window 2i+2.
func worstRepeated(c Config) []Request {
	w := int64(c.Window)
	var reqs []Request
	for k := range c.Keys {
		key := c.key(k)
		for j := int64(1); j+1 < int64(c.Windows); j += 2 {
			reqs = append(reqs, worstPair(key, c.Limit, w, j)...)
		}
	}
	return merge(reqs)
}

// worstPair is L unit requests at (j+1)·W − 1 ns, the last instant of
// window j, then L at (j+2)·W − 2 ns, the last-but-one instant of window
// j+1: one nanosecond less than W apart, so all of them fall in one
// trailing window (t−W, t].
func worstPair(key string, limit int, w, j int64) []Request {
	reqs := make([]Request, 0, 2*limit)
	for range limit {
		reqs = append(reqs, Request{Key: key, At: (j+1)*w - 1, Cost: 1})
	}
	for range limit {
		reqs = append(reqs, Request{Key: key, At: (j+2)*w - 2, Cost: 1})
	}
	return reqs
}
