package loadtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/lab/internal/latency"
)

// The server's own cost. vegeta's share of a slice's CPU is the larger
// one, and the same for both targets, so the slices' CPU per request
// cannot tell what slidegate's server adds to a request. The cost rounds
// measure it directly: in each, a minimal client (costConns keep-alive
// connections writing pre-rendered requests, the bodies and headers
// vegeta sends, and reading each answer's status line and headers, its
// body skipped by its length) sends Config.CapacityCostBurst requests to slidegate and
// as many to the no-op, in costSplits alternating parts a side (ABBA
// order, the first side alternating by round), so that a spell of the
// machine's (a scheduling pattern, another process's burst) lands on
// both sides rather than on one. A round's
// figure is slidegate's process CPU per request less the no-op's: the
// client's part is the same for both but for the few more header lines it
// reads, so what remains is the server's decision path (decode, key and
// policy lookup, the decision, headers, metrics, and the harness's
// recording of decisions) and net/http's cost of the longer answer.

// Sizes of the cost rounds (the burst is Config.CapacityCostBurst).
const (
	costRounds = 15
	costConns  = 4
	costSplits = 8
)

// costGoalNs is what slidegate's server may add to a request's CPU over
// the no-op's, in nanoseconds. It is shown beside the figure and not
// judged: an absolute figure depends on the machine.
const costGoalNs = 3000

// costRound is one round of the cost measurement.
type costRound struct {
	SlidegateNs float64 `json:"slidegate_cpu_per_request_ns"`
	NoopNs      float64 `json:"noop_cpu_per_request_ns"`
	ExtraNs     float64 `json:"extra_ns"`     // slidegate's less the no-op's
	Others      float64 `json:"others_cores"` // -1 where it cannot be read
	Disturbed   bool    `json:"disturbed"`    // Others over capacityBusy: left out
}

// serverCost is the cost rounds' outcome.
type serverCost struct {
	Rounds []costRound `json:"rounds"`
	Burst  int         `json:"burst"` // requests per target per round
	// ExtraNs is the median of the clean rounds' ExtraNs; Lo and Hi the
	// interval that covers it with probability Confidence (as a
	// target's, medianInterval); Clean how many rounds there were.
	ExtraNs    float64 `json:"extra_ns"`
	Lo         float64 `json:"lo_ns"`
	Hi         float64 `json:"hi_ns"`
	Confidence float64 `json:"confidence"`
	Clean      int     `json:"clean"`
}

// summarize fills in the median of the clean rounds and its interval.
func (c *serverCost) summarize() {
	var xs []float64
	for _, r := range c.Rounds {
		if !r.Disturbed {
			xs = append(xs, r.ExtraNs)
		}
	}
	c.Clean = len(xs)
	c.ExtraNs, c.Lo, c.Hi, c.Confidence = 0, 0, 0, 0
	if len(xs) == 0 {
		return
	}
	slices.Sort(xs)
	k, cover := medianInterval(len(xs), judgeConfidence)
	c.ExtraNs, c.Lo, c.Hi, c.Confidence = latency.Median(xs), xs[k-1], xs[len(xs)-k], cover
}

// line is the figure in one line, against costGoalNs.
func (c *serverCost) line() string {
	if c.Clean == 0 {
		return fmt.Sprintf("no clean round of %d (other processes used over %.1f core)", len(c.Rounds), capacityBusy)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "slidegate's server adds %s of CPU per request over the no-op's (median of %d rounds, %.0f%% interval %s … %s; want ≤ %s, shown, not judged)",
		fmtNs(int64(c.ExtraNs)), c.Clean, 100*c.Confidence, fmtNs(int64(c.Lo)), fmtNs(int64(c.Hi)), fmtNs(costGoalNs))
	return b.String()
}

// runServerCost runs the cost rounds against the servers at sgBase and
// noopBase, and adds slidegate's answers to total (its decisions are
// recorded and verified with the slices').
func runServerCost(ctx context.Context, cfg Config, policies []engine.Policy, sgBase, noopBase string, total *attackResult) (*serverCost, error) {
	sg, err := costRequests(sgBase, policies, cfg.Clients)
	if err != nil {
		return nil, err
	}
	noop, err := costRequests(noopBase, policies, cfg.Clients)
	if err != nil {
		return nil, err
	}
	n := max(1, cfg.CapacityCostBurst/costSplits)
	c := &serverCost{Burst: n * costSplits}
	burst := func(name string, reqs *costTarget) (float64, error) {
		var ns float64
		var err error
		runtime.GC() // as before a slice: no burst pays for the other's garbage
		pprof.Do(ctx, pprof.Labels("target", name, "side", "client"), func(context.Context) {
			cpu0 := cpuSeconds()
			var allowed, refused int
			allowed, refused, err = reqs.burst(n)
			ns = (cpuSeconds() - cpu0) / float64(n) * 1e9
			if reqs == sg {
				total.allowed += int64(allowed)
				total.refused += int64(refused)
			}
		})
		return ns, err
	}
	// One burst each first: connections and the first allocations stay
	// out of the rounds.
	for i, t := range []*costTarget{sg, noop} {
		if _, err := burst([]string{"slidegate", "no-op"}[i], t); err != nil {
			return nil, err
		}
	}
	err = untilClean(costRounds, func(r int) (bool, error) {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		var rd costRound
		m := startOthers()
		for pass := range 2 * costSplits {
			// ABBA: the side flips within each pair of parts and between
			// pairs, so a drift over the round weighs on both alike.
			sgTurn := (pass%2 == 0) == ((r+pass/2)%2 == 0)
			var ns float64
			var err error
			if sgTurn {
				ns, err = burst("slidegate", sg)
				rd.SlidegateNs += ns / costSplits
			} else {
				ns, err = burst("no-op", noop)
				rd.NoopNs += ns / costSplits
			}
			if err != nil {
				return false, err
			}
		}
		rd.ExtraNs = rd.SlidegateNs - rd.NoopNs
		rd.Others = m.cores(0)
		rd.Disturbed = rd.Others > capacityBusy
		c.Rounds = append(c.Rounds, rd)
		return !rd.Disturbed, nil
	})
	if err != nil {
		return nil, err
	}
	c.summarize()
	return c, nil
}

// costTarget is one server's pre-rendered requests.
type costTarget struct {
	host string
	reqs [][]byte
	next atomic.Int64
}

// costRequests renders the requests of the cost rounds for base: POST
// /v1/allow with the headers vegeta sends, a body of cost 1 for a client
// key in [0, clients) under each policy in turn.
func costRequests(base string, policies []engine.Policy, clients int) (*costTarget, error) {
	host, ok := strings.CutPrefix(base, "http://")
	if !ok || len(policies) == 0 {
		return nil, fmt.Errorf("loadtest: cost rounds: base %q, %d policies", base, len(policies))
	}
	const n = 1 << 12
	t := &costTarget{host: host, reqs: make([][]byte, n)}
	for i := range t.reqs {
		body := `{"key":"` + clientKey(i*7919%max(1, clients)) + `","policy":` + strconv.Quote(policies[i%len(policies)].Name) + `,"cost":1}`
		t.reqs[i] = []byte("POST /v1/allow HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: Go-http-client/1.1\r\n" +
			"Content-Length: " + strconv.Itoa(len(body)) + "\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n" + body)
	}
	return t, nil
}

// burst sends n requests over costConns connections and returns the
// answers counted as allowed (200, 204) and refused (429).
func (t *costTarget) burst(n int) (allowed, refused int, err error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for c := range costConns {
		per := n / costConns
		if c == 0 {
			per += n % costConns
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, r, err := rawClient(t.host, per, func() []byte { return t.reqs[t.next.Add(1)&int64(len(t.reqs)-1)] })
			mu.Lock()
			defer mu.Unlock()
			allowed, refused = allowed+a, refused+r
			if err != nil {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return allowed, refused, fmt.Errorf("loadtest: cost rounds: %w", errs[0])
	}
	return allowed, refused, nil
}

// rawClient sends n requests on one connection, one at a time, and reads
// each answer: 200, 204 or 429, its body skipped by its Content-Length.
// It returns the answers counted as allowed (200, 204) and refused (429).
func rawClient(host string, n int, req func() []byte) (allowed, refused int, err error) {
	conn, err := net.Dial("tcp", host)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	br := bufio.NewReaderSize(conn, 4096)
	for range n {
		if _, err := conn.Write(req()); err != nil {
			return allowed, refused, err
		}
		length := 0
		for first := true; ; first = false {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return allowed, refused, err
			}
			if first {
				switch {
				case bytes.HasPrefix(line, []byte("HTTP/1.1 200 ")), bytes.HasPrefix(line, []byte("HTTP/1.1 204 ")):
					allowed++
				case bytes.HasPrefix(line, []byte("HTTP/1.1 429 ")):
					refused++
				default:
					return allowed, refused, fmt.Errorf("unexpected status line %q", line)
				}
			}
			if len(line) <= 2 {
				break
			}
			if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
				if length, err = strconv.Atoi(string(bytes.TrimSpace(v))); err != nil {
					return allowed, refused, err
				}
			}
		}
		if _, err := br.Discard(length); err != nil {
			return allowed, refused, err
		}
	}
	return allowed, refused, nil
}
