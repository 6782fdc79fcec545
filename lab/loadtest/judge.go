package loadtest

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

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
// otherwise. Rounds that other processes disturbed are left out; with
// too few clean rounds left the target is undecided: the machine was too
// busy to judge.
//
// Sequential rounds. A target whose true median is near its bound needs
// more rounds than one far from it before its interval clears the bound.
// So capacity is looked at twice at most (seqPlan): at its first look's
// clean rounds, and, still undecided there, again after more rounds, up
// to its last look's count or its time budget. Sequential rounds need
// rounds that are alike whenever they run: a capacity round is a pair of
// slices against servers whose state hardly changes. The engine's rounds
// are not alike: they run one recorded stream in order, and the engine
// gains keys as it goes, so later rounds measure a fuller table than the
// first ones. Rounds added after a look would then move the median they
// are meant to pin down; the engine is judged on its fixed rounds, looked
// at once.
//
// Each look may stop the rounds, and looking twice gives the interval
// two chances to miss the median. So the chance judgeAlpha is split
// between the looks (Bonferroni): each look's interval covers the median
// with probability at least 1 − judgeAlpha/looks. Whatever the rule that
// picks the look, the judged interval then misses the median with
// probability at most judgeAlpha. A wrong met (or a wrong missed) comes
// at most judgeAlpha/2 of the time: the interval must miss on that one
// side. Two runs give opposite verdicts only if one of them is wrong.
// The bound holds because the looks' counts are fixed beforehand and the
// time budget does not look at the ratios.

// Verdicts of a target.
const (
	verdictMet       = "met"
	verdictMissed    = "missed"
	verdictUndecided = "undecided"
)

// judgeAlpha is the chance that a target's judged interval misses the
// median, over all its looks: at most judgeAlpha/2 on each side.
const judgeAlpha = 0.10

// judgeConfidence is the coverage a target looked at once aims at: the
// narrowest interval that covers the median at least this often.
const judgeConfidence = 1 - judgeAlpha

// minJudgeRounds is the fewest clean rounds a target looked at once is
// judged on: with fewer, even the widest interval (the smallest and the
// largest round) covers the median less than judgeConfidence of the
// time (5 rounds: 93.75%). minRounds gives it for more looks.
const minJudgeRounds = 5

// lookConfidence is the coverage of each look's interval when a target
// is looked at up to looks times.
func lookConfidence(looks int) float64 { return 1 - judgeAlpha/float64(max(1, looks)) }

// minRounds is the fewest clean rounds whose widest interval covers the
// median with probability conf: 1 − 2·2⁻ⁿ ≥ conf.
func minRounds(conf float64) int {
	n := 1
	for 1-2*math.Pow(0.5, float64(n)) < conf {
		n++
	}
	return n
}

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
	// Rounds is every round's ratio, in the order measured, up to the
	// look that judged it; Disturbed marks (by index) the rounds other
	// processes disturbed, left out of the judgement.
	Rounds    []float64 `json:"rounds"`
	Disturbed []bool    `json:"disturbed,omitempty"`
	// Clean is how many rounds were judged; Median is their median, and
	// Lo and Hi the interval that covers it with probability Confidence.
	Clean      int     `json:"clean"`
	Median     float64 `json:"median"`
	Lo         float64 `json:"lo"`
	Hi         float64 `json:"hi"`
	Confidence float64 `json:"confidence"`
	// Look is the look that judged the target, of Looks at most (a
	// target looked at once has 1 of 1).
	Look  int `json:"look,omitempty"`
	Looks int `json:"looks,omitempty"`
}

// judgement is a target's verdict and, for an undecided one, why.
type judgement struct {
	Verdict string `json:"verdict"`
	Why     string `json:"why,omitempty"`
	Spread  spread `json:"spread"`
}

// decided reports whether the judgement is met or missed.
func (j judgement) decided() bool { return j.Verdict == verdictMet || j.Verdict == verdictMissed }

// turnTarget is a target judged on turnRounds: each round's ratio is
// slidegate's figure over the reference's, or the reference's over
// slidegate's where the figures are costs (lower is better), and goal
// bounds it.
type turnTarget struct {
	goal
	costs bool
}

// ratio is the round's ratio.
func (tt turnTarget) ratio(rd turnRound) float64 {
	if tt.costs {
		return ratioFloat(rd.Reference, rd.Slidegate)
	}
	return ratioFloat(rd.Slidegate, rd.Reference)
}

// judge judges the rounds' ratios against the goal, leaving out the
// rounds that say so.
func (tt turnTarget) judge(rounds []turnRound) judgement {
	ratios := make([]float64, len(rounds))
	left := make([]bool, len(rounds))
	for i, rd := range rounds {
		ratios[i], left[i] = tt.ratio(rd), rd.leftOut()
	}
	return judgeRounds(ratios, left, tt.goal)
}

// ratioFloat is a / b, NaN when b is not positive (judgeRounds leaves it
// out).
func ratioFloat(a, b float64) float64 {
	if !(b > 0) {
		return ratioNs(0, 0)
	}
	return a / b
}

// judgeRounds judges the rounds' ratios against g, looked at once.
// disturbed, when not nil, marks rounds to leave out (it has one entry
// per round).
func judgeRounds(rounds []float64, disturbed []bool, g goal) judgement {
	return judgeLook(rounds, disturbed, g, 1, 1)
}

// judgeLook judges the rounds' ratios against g at look of looks: the
// interval covers the median with probability lookConfidence(looks).
func judgeLook(rounds []float64, disturbed []bool, g goal, look, looks int) judgement {
	sp := spread{Look: look, Looks: looks}
	var clean []float64
	var marks []bool
	for i, x := range rounds {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			// A round with no ratio (a figure it divides by was not
			// measured) is not a round: nothing judges it, and the
			// report's JSON cannot hold it.
			continue
		}
		d := i < len(disturbed) && disturbed[i]
		sp.Rounds, marks = append(sp.Rounds, x), append(marks, d)
		if !d {
			clean = append(clean, x)
		}
	}
	if slices.Contains(marks, true) {
		sp.Disturbed = marks
	}
	sp.Clean = len(clean)
	j := judgement{Spread: sp}
	if len(clean) == 0 {
		j.Verdict, j.Why = verdictUndecided, "no clean round to judge"
		if len(sp.Rounds) > 0 {
			j.Why = "the machine was too busy to judge: other processes disturbed every round"
		}
		return j
	}
	conf := lookConfidence(looks)
	need := minRounds(conf)
	slices.Sort(clean)
	k, cover := medianInterval(len(clean), conf)
	j.Spread.Median = latency.Median(clean)
	j.Spread.Lo, j.Spread.Hi, j.Spread.Confidence = clean[k-1], clean[len(clean)-k], cover
	lo, hi := j.Spread.Lo, j.Spread.Hi
	switch {
	case len(clean) < need:
		j.Verdict = verdictUndecided
		disturbedN := len(sp.Rounds) - len(clean)
		if disturbedN > 0 {
			j.Why = fmt.Sprintf("the machine was too busy to judge: %d of %d rounds disturbed by other processes, %d clean (at least %d needed)",
				disturbedN, len(sp.Rounds), len(clean), need)
		} else {
			j.Why = fmt.Sprintf("%d rounds, at least %d needed", len(clean), need)
		}
	case g.good(lo) && g.good(hi):
		j.Verdict = verdictMet
	case !g.good(lo) && !g.good(hi):
		j.Verdict = verdictMissed
	default:
		j.Verdict = verdictUndecided
		j.Why = fmt.Sprintf("too noisy: the rounds' interval %s … %s straddles %s", fmtRatio(lo, g.Bound), fmtRatio(hi, g.Bound), fmtRatio(g.Bound, g.Bound))
		if looks > 1 && look == looks {
			j.Why += " at the last look"
		}
	}
	return j
}

// seqPlan is how a timed target's rounds run and when it is looked at.
// The first look is at First clean rounds (or at twice First rounds, if
// other processes disturbed that many). Undecided there, the rounds go
// on to the last look: Last clean rounds, twice Last rounds in all, or
// Budget since the first round began, whichever comes first. The
// budget never cuts the rounds before the first look. Last ≤ First means
// one look.
type seqPlan struct {
	First  int           `json:"first"`
	Last   int           `json:"last"`
	Budget time.Duration `json:"budget_ns"`
}

// looks is how many looks the plan allows.
func (p seqPlan) looks() int {
	if p.Last > p.First && p.Budget > 0 {
		return 2
	}
	return 1
}

// firstEnd is the count of rounds judged at the first look, or -1 while
// the rounds have not reached it.
func (p seqPlan) firstEnd(disturbed []bool) int {
	clean := 0
	for i, d := range disturbed {
		if !d {
			clean++
		}
		if clean == p.First || i+1 == 2*p.First {
			return i + 1
		}
	}
	return -1
}

// more reports whether another round should run after the rounds so
// far (disturbed marks the left-out ones), which took elapsed.
// decidedAt says whether every goal of the target is decided on the
// first n rounds.
func (p seqPlan) more(disturbed []bool, elapsed time.Duration, decidedAt func(n int) bool) bool {
	e1 := p.firstEnd(disturbed)
	if e1 < 0 {
		return true
	}
	if p.looks() == 1 || decidedAt(e1) {
		return false
	}
	clean := 0
	for _, d := range disturbed {
		if !d {
			clean++
		}
	}
	return clean < p.Last && len(disturbed) < 2*p.Last && elapsed < p.Budget
}

// judgeSequence judges the rounds against g as the plan looked at them:
// at the first look, and, undecided there with rounds after it, at the
// last look over every round. It is a function of the rounds alone, so
// that a report can be judged again from its JSON.
func judgeSequence(rounds []float64, disturbed []bool, g goal, p seqPlan) judgement {
	left := make([]bool, len(rounds))
	copy(left, disturbed)
	looks := p.looks()
	e1 := p.firstEnd(left)
	if e1 < 0 || e1 > len(rounds) {
		e1 = len(rounds)
	}
	j := judgeLook(rounds[:e1], left[:e1], g, 1, looks)
	if j.decided() || e1 == len(rounds) || looks == 1 {
		return j
	}
	return judgeLook(rounds, left, g, 2, looks)
}

// medianInterval is, for n sorted values, the rank k (1-based) such that
// the k-th smallest and the k-th largest cover the median with
// probability at least conf, as narrow as that allows, and the coverage.
// Below the count that reaches conf it is 1 (the smallest and the
// largest) with its lower coverage.
func medianInterval(n int, conf float64) (k int, coverage float64) {
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
	for k+1 <= (n+1)/2 && 1-2*tail(k+1) >= conf {
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
	if sp.Looks > 1 {
		fmt.Fprintf(&b, ", look %d of %d", sp.Look, sp.Looks)
	}
	return b.String()
}

// line is the plan in words, with how long the rounds ran and how many
// there were.
func (p seqPlan) line(rounds int, ran time.Duration) string {
	if p.looks() == 1 {
		return fmt.Sprintf("one look at %d clean rounds (up to %d in all); %d rounds ran in %.1f s", p.First, 2*p.First, rounds, ran.Seconds())
	}
	return fmt.Sprintf("looked at %d clean rounds (up to %d in all) and, undecided there, again at %d clean rounds (up to %d in all) or a time budget of %.0f s; each look's interval at %.0f%%; %d rounds ran in %.1f s",
		p.First, 2*p.First, p.Last, 2*p.Last, p.Budget.Seconds(), 100*lookConfidence(p.looks()), rounds, ran.Seconds())
}

// left reports whether round i was disturbed, and left out.
func (sp spread) left(i int) bool { return i < len(sp.Disturbed) && sp.Disturbed[i] }

// roundsList renders every round's ratio, a disturbed one marked with *.
func (sp spread) roundsList(bound float64) string {
	s := make([]string, len(sp.Rounds))
	for i, x := range sp.Rounds {
		s[i] = fmtRatio(x, bound)
		if sp.left(i) {
			s[i] += "*"
		}
	}
	return strings.Join(s, " ")
}
