package reference

import (
	"cmp"
	"fmt"
	"slices"
)

// Record is one decision made by a limiter under test.
type Record struct {
	Key        string
	Cost       int
	At         int64
	Allowed    bool
	Remaining  int
	RetryAfter int64
	Reset      int64
}

// Report is what Verify found.
type Report struct {
	Decisions int
	Allowed   int
	Refused   int
	// Mismatches: decisions whose replay through the model differs in any
	// field.
	Mismatches int
	// OverAdmissions: accepted requests that brought some window of length
	// W over the limit (counted from the recorded accepts alone).
	OverAdmissions int
	// UnderAdmissions: refusals although the recorded accepts left room for
	// them at their instant.
	UnderAdmissions int
	// Examples of the first few failures, for humans.
	Examples []string
}

// OK reports whether nothing was found.
func (r Report) OK() bool {
	return r.Mismatches == 0 && r.OverAdmissions == 0 && r.UnderAdmissions == 0
}

const maxExamples = 5

func (r *Report) example(format string, args ...any) {
	if len(r.Examples) < maxExamples {
		r.Examples = append(r.Examples, fmt.Sprintf(format, args...))
	}
}

// Order sorts records into replay order: by key, then by At; among equal
// instants of one key, by the state each decision observed. At one instant
// a key's state only grows (each accept adds its cost), so a decision that
// saw more remaining room came first, and a refusal that saw the same room
// as an accept came before it (the accept would have left less).
func Order(recs []Record) {
	// Records equal in every compared field are interchangeable (refusals
	// of one state at one instant), so an unstable sort will do.
	slices.SortFunc(recs, func(a, b Record) int { return cmpEntries(entry{a, a.Allowed}, entry{b, b.Allowed}) })
}

// entry is one limit's part of a decision: its record, and whether the
// request was logged. For a single limit that is whether it was allowed;
// in a group, a limit with room (rec.Allowed) is logged only if every
// limit of the request had room.
type entry struct {
	rec    Record
	commit bool
}

// room is the room the decision observed before it.
func (e entry) room() int {
	if e.commit {
		return e.rec.Remaining + e.rec.Cost
	}
	return e.rec.Remaining
}

// cmpEntries is the replay order of Order, for entries.
func cmpEntries(a, b entry) int {
	if c := cmp.Compare(a.rec.Key, b.rec.Key); c != 0 {
		return c
	}
	if c := cmp.Compare(a.rec.At, b.rec.At); c != 0 {
		return c
	}
	if c := cmp.Compare(b.room(), a.room()); c != 0 {
		return c
	}
	return cmp.Compare(boolInt(a.commit), boolInt(b.commit))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// VerifyLog replays recs (in any order; they are sorted in place) through a
// fresh log model of the given policy and checks the exactness guarantees
// on the recorded accepts.
func VerifyLog(limit int, window int64, recs []Record) Report {
	return verify(NewLog(limit, window), limit, window, recs, true)
}

// VerifyCounter replays recs through a fresh counter model. Over- and
// under-admissions are not counted: the counter errs both ways by design.
func VerifyCounter(limit int, window int64, recs []Record) Report {
	return verify(NewCounter(limit, window), limit, window, recs, false)
}

func verify(m Model, limit int, window int64, recs []Record, exact bool) Report {
	es := make([]entry, len(recs))
	for i, r := range recs {
		es[i] = entry{r, r.Allowed}
	}
	var rep Report
	rep.Decisions = len(recs)
	for _, r := range recs {
		if r.Allowed {
			rep.Allowed++
		} else {
			rep.Refused++
		}
	}
	replayLimit(&rep, m, es, replayed{limit, window, exact, ""})
	for i := range es {
		recs[i] = es[i].rec // left in replay order, as Order leaves them
	}
	return rep
}

// replayed is the limit whose entries replayLimit replays, and the label
// that starts its examples.
type replayed struct {
	limit  int
	window int64
	exact  bool
	label  string
}

// replayLimit sorts one limit's entries into replay order and replays them
// through m (Decide for logged ones, Peek for the others), comparing every
// field, and for an exact limit checks each key's windows from the logged
// entries alone.
func replayLimit(rep *Report, m Model, es []entry, lim replayed) {
	limit, window, exact, label := lim.limit, lim.window, lim.exact, lim.label
	slices.SortFunc(es, cmpEntries)
	for i := 0; i < len(es); {
		j := i
		for j < len(es) && es[j].rec.Key == es[i].rec.Key {
			j++
		}
		for _, e := range es[i:j] {
			r := e.rec
			if r.Cost < 1 || r.Cost > limit {
				// No limiter may decide such a request; the models cannot.
				rep.Mismatches++
				rep.example("%sinvalid cost key=%q at=%d cost=%d (limit %d) was decided", label, r.Key, r.At, r.Cost, limit)
				continue
			}
			var want Result
			if e.commit {
				want = m.Decide(r.Key, r.Cost, r.At)
			} else {
				want = m.Peek(r.Key, r.Cost, r.At)
			}
			got := Result{Allowed: r.Allowed, Remaining: r.Remaining, RetryAfter: r.RetryAfter, Reset: r.Reset}
			if got != want {
				rep.Mismatches++
				rep.example("%smismatch key=%q at=%d cost=%d logged=%v: got %+v, model %+v", label, r.Key, r.At, r.Cost, e.commit, got, want)
			}
		}
		if exact {
			checkWindows(rep, es[i:j], limit, window, label)
		}
		i = j
	}
}

// checkWindows counts over- and under-admissions of one key's entries
// (sorted by At) from the logged ones alone, independently of any model:
// the logged cost in (t−W, t] must never exceed the limit, and a refusal
// by this limit at t of cost n must find less than n room there. An entry
// with room that was not logged (another limit of its group refused) is
// neither.
func checkWindows(rep *Report, es []entry, limit int, window int64, label string) {
	type accept struct {
		at   int64
		cost int
	}
	var live []accept // oldest first
	sum := 0
	for _, e := range es {
		r := e.rec
		for len(live) > 0 && live[0].at <= r.At-window {
			sum -= live[0].cost
			live = live[1:]
		}
		switch {
		case e.commit:
			live = append(live, accept{r.At, r.Cost})
			sum += r.Cost
			if sum > limit {
				rep.OverAdmissions++
				rep.example("%sover-admission key=%q at=%d: %d accepted in (t-W, t], limit %d", label, r.Key, r.At, sum, limit)
			}
		case !r.Allowed && sum+r.Cost <= limit:
			rep.UnderAdmissions++
			rep.example("%sunder-admission key=%q at=%d cost=%d: only %d accepted in (t-W, t], limit %d", label, r.Key, r.At, r.Cost, sum, limit)
		}
	}
}

// GroupRecord is one decision made by a group limiter under test: a
// request of cost Cost counting Keys[i] against limit Policies[i] (against
// limit i when Policies is nil).
type GroupRecord struct {
	Keys     []string
	Policies []int
	Cost     int
	// Costs, when not nil, is each limit's own cost instead of Cost (a
	// (policy, key) pair repeated in one request is charged the largest
	// of its costs).
	Costs   []int
	At      int64
	Allowed bool
	// Limits holds each limit's fields; Limits[i].Allowed says whether
	// limit i had room.
	Limits []Result
}

// VerifyGroup replays recs through one fresh model per limit (models[p] for
// policy p; each is used only by this call) and checks, for every limit and
// key, every field of every decision, and for log limits (exact[p]) the
// windows: no over-admission among the logged requests, and no refusal
// by a limit that had room. A request must be logged (Allowed) iff
// every limit had room; a (policy, key) pair repeated in one request counts
// once, and its entries must agree. Decisions are ordered per limit and key
// by At, and within an instant by the room each observed.
func VerifyGroup(models []Model, limits []int, windows []int64, exact []bool, recs []GroupRecord) Report {
	var rep Report
	rep.Decisions = len(recs)
	perPolicy := make([][]entry, len(models))
	for _, r := range recs {
		all := true
		seen := map[[2]string]Result{}
		cost := map[[2]string]int{}
		for i := range r.Limits {
			p := i
			if r.Policies != nil {
				p = r.Policies[i]
			}
			id := [2]string{fmt.Sprint(p), r.Keys[i]}
			c := r.Cost
			if r.Costs != nil {
				c = r.Costs[i]
			}
			cost[id] = max(cost[id], c)
		}
		for i, l := range r.Limits {
			all = all && l.Allowed
			p := i
			if r.Policies != nil {
				p = r.Policies[i]
			}
			id := [2]string{fmt.Sprint(p), r.Keys[i]}
			if prev, ok := seen[id]; ok {
				if prev != l {
					rep.Mismatches++
					rep.example("keys=%q at=%d: policy %d key %q repeated with different results", r.Keys, r.At, p, r.Keys[i])
				}
				continue
			}
			seen[id] = l
			perPolicy[p] = append(perPolicy[p], entry{Record{Key: r.Keys[i], Cost: cost[id], At: r.At, Allowed: l.Allowed,
				Remaining: l.Remaining, RetryAfter: l.RetryAfter, Reset: l.Reset}, r.Allowed})
		}
		if all != r.Allowed {
			rep.Mismatches++
			rep.example("keys=%q at=%d: allowed=%v, but every limit had room: %v", r.Keys, r.At, r.Allowed, all)
		}
		if r.Allowed {
			rep.Allowed++
		} else {
			rep.Refused++
		}
	}
	for i, m := range models {
		replayLimit(&rep, m, perPolicy[i], replayed{limits[i], windows[i], exact[i], fmt.Sprintf("limit %d: ", i)})
	}
	return rep
}
