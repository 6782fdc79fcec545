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
