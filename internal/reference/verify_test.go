package reference

import "testing"

// The verifier must be able to fail: each planted fault is found.
func TestVerifyFindsPlantedFaults(t *testing.T) {
	const L, W = 2, 100
	good := []Record{
		{Key: "a", Cost: 1, At: 0, Allowed: true, Remaining: 1, Reset: 100},
		{Key: "a", Cost: 1, At: 10, Allowed: true, Remaining: 0, Reset: 90},
		{Key: "a", Cost: 1, At: 20, Allowed: false, Remaining: 0, Reset: 80, RetryAfter: 80},
		{Key: "a", Cost: 1, At: 100, Allowed: true, Remaining: 0, Reset: 10},
	}
	if rep := VerifyLog(L, W, append([]Record(nil), good...)); !rep.OK() || rep.Allowed != 3 || rep.Refused != 1 {
		t.Fatalf("clean trace: %+v", rep)
	}
	over := append([]Record(nil), good...)
	over[2].Allowed, over[2].RetryAfter = true, 0
	if rep := VerifyLog(L, W, over); rep.OverAdmissions == 0 || rep.Mismatches == 0 {
		t.Errorf("planted over-admission not found: %+v", rep)
	}
	under := append([]Record(nil), good...)
	under[1].Allowed = false
	if rep := VerifyLog(L, W, under); rep.UnderAdmissions == 0 {
		t.Errorf("planted under-admission not found: %+v", rep)
	}
	field := append([]Record(nil), good...)
	field[3].Reset = 11
	if rep := VerifyLog(L, W, field); rep.Mismatches != 1 || rep.OverAdmissions+rep.UnderAdmissions != 0 {
		t.Errorf("planted field mismatch: %+v", rep)
	}
	bad := append([]Record(nil), good...)
	bad[0].Cost = 3
	if rep := VerifyLog(L, W, bad); rep.Mismatches == 0 {
		t.Errorf("cost above the limit not reported: %+v", rep)
	}
}

// Equal instants are replayed in the order the state implies, whatever
// order the records arrive in.
func TestOrderTies(t *testing.T) {
	recs := []Record{
		{Key: "k", Cost: 1, At: 5, Allowed: false, Remaining: 0, Reset: 100, RetryAfter: 100},
		{Key: "k", Cost: 1, At: 5, Allowed: true, Remaining: 0, Reset: 100},
		{Key: "k", Cost: 1, At: 5, Allowed: true, Remaining: 1, Reset: 100},
	}
	if rep := VerifyLog(2, 100, recs); !rep.OK() {
		t.Fatalf("%+v", rep)
	}
}

// The group verifier finds the same planted faults per limit, and does not
// count a limit that had room in a refused request as anything but that.
func TestVerifyGroupFindsPlantedFaults(t *testing.T) {
	models := func() []Model { return []Model{NewLog(1, 100), NewLog(2, 100)} }
	limits, windows, exact := []int{1, 2}, []int64{100, 100}, []bool{true, true}
	good := []GroupRecord{
		{Keys: []string{"u", "ip"}, Cost: 1, At: 0, Allowed: true,
			Limits: []Result{{Allowed: true, Remaining: 0, Reset: 100}, {Allowed: true, Remaining: 1, Reset: 100}}},
		// The first limit refuses; the second had room and is not charged.
		{Keys: []string{"u", "ip"}, Cost: 1, At: 10, Allowed: false,
			Limits: []Result{{Allowed: false, Remaining: 0, RetryAfter: 90, Reset: 90}, {Allowed: true, Remaining: 1, Reset: 90}}},
	}
	clone := func() []GroupRecord {
		out := make([]GroupRecord, len(good))
		for i, r := range good {
			r.Limits = append([]Result(nil), r.Limits...)
			out[i] = r
		}
		return out
	}
	if rep := VerifyGroup(models(), limits, windows, exact, clone()); !rep.OK() || rep.Allowed != 1 || rep.Refused != 1 {
		t.Fatalf("clean trace: %+v", rep)
	}
	under := clone()
	under[0].Allowed, under[0].Limits[0] = false, Result{Allowed: false, Remaining: 1}
	if rep := VerifyGroup(models(), limits, windows, exact, under); rep.UnderAdmissions == 0 {
		t.Errorf("a limit refusing with room was not found: %+v", rep)
	}
	over := clone()
	over[1].Allowed, over[1].Limits[0] = true, Result{Allowed: true, Remaining: 0, Reset: 90}
	if rep := VerifyGroup(models(), limits, windows, exact, over); rep.OverAdmissions == 0 || rep.Mismatches == 0 {
		t.Errorf("planted over-admission not found: %+v", rep)
	}
}
