package loadtest

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/slidegate/slidegate/lab/internal/latency"
)

// How a target is judged. One measurement of a ratio is one draw: on a
// shared machine two runs minutes apart can land on either side of a
// bound. So a target is measured in rounds, each giving one ratio of two
// figures taken side by side, and judged on a confidence interval of the
// rounds' median. The interval is distribution-free: the k-th smallest
// and k-th largest of n rounds cover the median with probability
// 1 − 2·P(Binomial(n, ½) < k), whatever the ratios' distribution. A
// target is met when the whole interval is on the good side of its bound,
// missed when the whole interval is on the bad side, and undecided
// otherwise. Two runs can only give opposite verdicts if one of their
// intervals missed the median, which the confidence bounds. Rounds that
// other processes disturbed are left out (and, where a phase can, run
// again); with too few clean rounds left the target is undecided: the
// machine was too busy to judge.

// Verdicts of a target.
const (
	verdictMet       = "met"
	verdictMissed    = "missed"
	verdictUndecided = "undecided"
)

// judgeConfidence is the coverage the interval aims at: the largest k
// whose interval covers the median at least this often.
const judgeConfidence = 0.90

// minJudgeRounds is the fewest clean rounds a target is judged on: with
// fewer, even the widest interval (the smallest and largest round)
// covers the median less than judgeConfidence of the time (5 rounds:
// 93.75%).
const minJudgeRounds = 5

// goal is a target's bound and its good side.
type goal struct {
	Bound  float64
	AtMost bool // the ratio must be at most Bound (else at least)
}

// want renders the goal, e.g. "≤ 2.00×" or "≥ 0.85".
func (g goal) want(unit string) string {
	if g.AtMost {
		return fmt.Sprintf("≤ %.2f%s", g.Bound, unit)
	}
	return fmt.Sprintf("≥ %.2f%s", g.Bound, unit)
}

// good reports whether x is on the goal's good side (the bound itself is
// good).
func (g goal) good(x float64) bool {
	if g.AtMost {
		return x <= g.Bound
	}
	return x >= g.Bound
}

// spread is what a target was judged from: every round's ratio, which of
// them were left out, and the interval.
type spread struct {
	// Rounds is every round's ratio, in the order measured; Disturbed
	// marks (by index) the rounds other processes disturbed, left out of
	// the judgement.
	Rounds    []float64 `json:"rounds"`
	Disturbed []bool    `json:"disturbed,omitempty"`
	// Clean is how many rounds were judged; Median is their median, and
	// Lo and Hi the interval that covers it with probability Confidence.
	Clean      int     `json:"clean"`
	Median     float64 `json:"median"`
	Lo         float64 `json:"lo"`
	Hi         float64 `json:"hi"`
	Confidence float64 `json:"confidence"`
}

// judgement is a target's verdict and, for an undecided one, why.
type judgement struct {
	Verdict string `json:"verdict"`
	Why     string `json:"why,omitempty"`
	Spread  spread `json:"spread"`
}

// judgedRound is a round of a target measured in rounds of its own.
type judgedRound interface {
	ratio() float64
	leftOut() bool
}

// judgeEach judges the rounds' ratios against g, leaving out the rounds
// that say so.
func judgeEach[R judgedRound](rounds []R, g goal) judgement {
	ratios := make([]float64, len(rounds))
	left := make([]bool, len(rounds))
	for i, rd := range rounds {
		ratios[i], left[i] = rd.ratio(), rd.leftOut()
	}
	return judgeRounds(ratios, left, g)
}

// judgeRounds judges the rounds' ratios against g. disturbed, when not
// nil, marks rounds to leave out (it has one entry per round).
func judgeRounds(rounds []float64, disturbed []bool, g goal) judgement {
	sp := spread{Rounds: slices.Clone(rounds)}
	var clean []float64
	for i, x := range rounds {
		if i < len(disturbed) && disturbed[i] {
			continue
		}
		if math.IsNaN(x) || math.IsInf(x, 0) {
			continue
		}
		clean = append(clean, x)
	}
	if slices.Contains(disturbed, true) {
		sp.Disturbed = slices.Clone(disturbed)
	}
	sp.Clean = len(clean)
	j := judgement{Spread: sp}
	if len(clean) == 0 {
		j.Verdict, j.Why = verdictUndecided, "no clean round to judge"
		if len(rounds) > 0 {
			j.Why = "the machine was too busy to judge: other processes disturbed every round"
		}
		return j
	}
	slices.Sort(clean)
	k, conf := medianInterval(len(clean))
	j.Spread.Median = latency.Median(clean)
	j.Spread.Lo, j.Spread.Hi, j.Spread.Confidence = clean[k-1], clean[len(clean)-k], conf
	lo, hi := j.Spread.Lo, j.Spread.Hi
	switch {
	case len(clean) < minJudgeRounds:
		j.Verdict = verdictUndecided
		disturbedN := len(rounds) - len(clean)
		if disturbedN > 0 {
			j.Why = fmt.Sprintf("the machine was too busy to judge: %d of %d rounds disturbed by other processes, %d clean (at least %d needed)",
				disturbedN, len(rounds), len(clean), minJudgeRounds)
		} else {
			j.Why = fmt.Sprintf("%d rounds, at least %d needed", len(clean), minJudgeRounds)
		}
	case g.good(lo) && g.good(hi):
		j.Verdict = verdictMet
	case !g.good(lo) && !g.good(hi):
		j.Verdict = verdictMissed
	default:
		j.Verdict = verdictUndecided
		j.Why = fmt.Sprintf("too noisy: the rounds' interval %s … %s straddles %s", fmtRatio(lo, g.Bound), fmtRatio(hi, g.Bound), fmtRatio(g.Bound, g.Bound))
	}
	return j
}

// medianInterval is, for n sorted values, the rank k (1-based) such that
// the k-th smallest and the k-th largest cover the median with
// probability at least judgeConfidence, as narrow as that allows, and
// the coverage. Below the count that reaches judgeConfidence it is 1
// (the smallest and the largest) with its lower coverage.
func medianInterval(n int) (k int, confidence float64) {
	// tail(k) = P(Binomial(n, ½) ≤ k−1): the chance that fewer than k
	// values fall below the median.
	tail := func(k int) float64 {
		var p float64
		for i := 0; i < k; i++ {
			p += binomial(n, i)
		}
		return p / math.Pow(2, float64(n))
	}
	k = 1
	for k+1 <= (n+1)/2 && 1-2*tail(k+1) >= judgeConfidence {
		k++
	}
	return k, 1 - 2*tail(k)
}

// binomial is n choose k, as a float64.
func binomial(n, k int) float64 {
	r := 1.0
	for i := 1; i <= k; i++ {
		r = r * float64(n-k+i) / float64(i)
	}
	return r
}

// fmtRatio formats x with the fewest digits (two at least, six at most)
// that tell it apart from bound when they differ, so that a miss never
// prints as the bound itself ("want ≤ 2.00× got 2.00× missed").
func fmtRatio(x, bound float64) string {
	for d := 2; d < 6; d++ {
		s := fmt.Sprintf("%.*f", d, x)
		if x == bound || s != fmt.Sprintf("%.*f", d, bound) {
			return s
		}
	}
	return fmt.Sprintf("%.6f", x)
}

// describe is the judgement in one line: the verdict, the median, the
// interval and the rounds.
func (j judgement) describe(g goal, unit string) string {
	sp := j.Spread
	if sp.Clean == 0 {
		return fmt.Sprintf("no clean round of %d", len(sp.Rounds))
	}
	if len(sp.Rounds) == 1 && sp.Confidence == 1 {
		return fmt.Sprintf("%s%s (one measurement, not timed)", fmtRatio(sp.Median, g.Bound), unit)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "median %s%s, %.0f%% interval %s … %s over %d rounds", fmtRatio(sp.Median, g.Bound), unit,
		100*sp.Confidence, fmtRatio(sp.Lo, g.Bound), fmtRatio(sp.Hi, g.Bound), sp.Clean)
	if n := len(sp.Rounds) - sp.Clean; n > 0 {
		fmt.Fprintf(&b, " (%d disturbed left out)", n)
	}
	return b.String()
}

// roundsList renders every round's ratio, a disturbed one marked with *.
func (sp spread) roundsList(bound float64) string {
	s := make([]string, len(sp.Rounds))
	for i, x := range sp.Rounds {
		s[i] = fmtRatio(x, bound)
		if i < len(sp.Disturbed) && sp.Disturbed[i] {
			s[i] += "*"
		}
	}
	return strings.Join(s, " ")
}
