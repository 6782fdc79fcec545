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
	slices.SortFunc(recs, func(a, b Record) int {
		if c := cmp.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		if c := cmp.Compare(a.At, b.At); c != 0 {
			return c
		}
		if c := cmp.Compare(roomBefore(b), roomBefore(a)); c != 0 {
			return c
		}
		return cmp.Compare(boolInt(a.Allowed), boolInt(b.Allowed))
	})
}

func roomBefore(r Record) int {
	if r.Allowed {
		return r.Remaining + r.Cost
	}
	return r.Remaining
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
	Order(recs)
	var rep Report
	rep.Decisions = len(recs)
	for i := 0; i < len(recs); {
		j := i
		for j < len(recs) && recs[j].Key == recs[i].Key {
			j++
		}
		key := recs[i:j]
		for _, r := range key {
			if r.Allowed {
				rep.Allowed++
			} else {
				rep.Refused++
			}
			if r.Cost < 1 || r.Cost > limit {
				// No limiter may decide such a request; the models cannot.
				rep.Mismatches++
				rep.example("invalid cost key=%q at=%d cost=%d (limit %d) was decided", r.Key, r.At, r.Cost, limit)
				continue
			}
			want := m.Decide(r.Key, r.Cost, r.At)
			got := Result{Allowed: r.Allowed, Remaining: r.Remaining, RetryAfter: r.RetryAfter, Reset: r.Reset}
			if got != want {
				rep.Mismatches++
				rep.example("mismatch key=%q at=%d cost=%d: got %+v, model %+v", r.Key, r.At, r.Cost, got, want)
			}
		}
		if exact {
			checkWindows(&rep, key, limit, window)
		}
		i = j
	}
	return rep
}

// checkWindows counts over- and under-admissions of one key's records
// (sorted by At) from the recorded accepts alone, independently of any
// model: the accepted cost in (t−W, t] must never exceed the limit, and a
// refusal at t of cost n must find less than n room there.
func checkWindows(rep *Report, recs []Record, limit int, window int64) {
	type entry struct {
		at   int64
		cost int
	}
	var live []entry // accepts, oldest first
	sum := 0
	for _, r := range recs {
		for len(live) > 0 && live[0].at <= r.At-window {
			sum -= live[0].cost
			live = live[1:]
		}
		if r.Allowed {
			live = append(live, entry{r.At, r.Cost})
			sum += r.Cost
			if sum > limit {
				rep.OverAdmissions++
				rep.example("over-admission key=%q at=%d: %d accepted in (t-W, t], limit %d", r.Key, r.At, sum, limit)
			}
		} else if sum+r.Cost <= limit {
			rep.UnderAdmissions++
			rep.example("under-admission key=%q at=%d cost=%d: only %d accepted in (t-W, t], limit %d", r.Key, r.At, r.Cost, sum, limit)
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
	At       int64
	Allowed  bool
	// Limits holds each limit's fields; Limits[i].Allowed says whether
	// limit i had room.
	Limits []Result
}

// VerifyGroup replays recs through one fresh model per limit (models[p] for
// policy p; each is used only by this call) and checks, for every limit and
// key, every field of every decision, and for log limits (exact[p]) the
// windows of the accepted requests. A request must be logged (Allowed) iff
// every limit had room; a (policy, key) pair repeated in one request counts
// once, and its entries must agree. Decisions are ordered per limit and key
// by At, and within an instant by the room each observed.
func VerifyGroup(models []Model, limits []int, windows []int64, exact []bool, recs []GroupRecord) Report {
	var rep Report
	rep.Decisions = len(recs)
	type one struct {
		rec    Record
		commit bool
	}
	perPolicy := make([][]one, len(models))
	for _, r := range recs {
		all := true
		seen := map[[2]string]Result{}
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
			perPolicy[p] = append(perPolicy[p], one{Record{Key: r.Keys[i], Cost: r.Cost, At: r.At, Allowed: l.Allowed,
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
		ones := perPolicy[i]
		room := func(o one) int {
			if o.commit {
				return o.rec.Remaining + o.rec.Cost
			}
			return o.rec.Remaining
		}
		slices.SortFunc(ones, func(a, b one) int {
			if c := cmp.Compare(a.rec.Key, b.rec.Key); c != 0 {
				return c
			}
			if c := cmp.Compare(a.rec.At, b.rec.At); c != 0 {
				return c
			}
			if c := cmp.Compare(room(b), room(a)); c != 0 {
				return c
			}
			return cmp.Compare(boolInt(a.commit), boolInt(b.commit))
		})
		var logged []Record
		for _, o := range ones {
			r := o.rec
			if r.Cost < 1 || r.Cost > limits[i] {
				rep.Mismatches++
				rep.example("limit %d: invalid cost %d was decided", i, r.Cost)
				continue
			}
			var want Result
			if o.commit {
				want = m.Decide(r.Key, r.Cost, r.At)
			} else {
				want = m.Peek(r.Key, r.Cost, r.At)
			}
			got := Result{Allowed: r.Allowed, Remaining: r.Remaining, RetryAfter: r.RetryAfter, Reset: r.Reset}
			if got != want {
				rep.Mismatches++
				rep.example("limit %d mismatch key=%q at=%d cost=%d logged=%v: got %+v, model %+v", i, r.Key, r.At, r.Cost, o.commit, got, want)
			}
			if o.commit {
				logged = append(logged, r)
			}
		}
		if exact[i] {
			// Over-admissions from the logged requests alone, per key.
			for k := 0; k < len(logged); {
				e := k
				for e < len(logged) && logged[e].Key == logged[k].Key {
					e++
				}
				var sub Report
				checkWindows(&sub, logged[k:e], limits[i], windows[i])
				rep.OverAdmissions += sub.OverAdmissions
				for _, x := range sub.Examples {
					rep.example("limit %d: %s", i, x)
				}
				k = e
			}
		}
	}
	return rep
}
