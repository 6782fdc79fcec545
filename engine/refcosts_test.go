package engine

import (
	"context"
	"testing"
	"time"
)

// Refs of different costs are decided together: all or nothing, each at
// its own cost; PeekRefs reads without charging.
func TestDecideGroupCostsAndPeek(t *testing.T) {
	clk := NewManualClock()
	clk.Set(time.Hour)
	g, err := NewGroup([]Policy{{Limit: 5, Window: time.Minute}, {Limit: 3, Window: time.Minute}}, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	refs := []Ref{{0, "a"}, {1, "b"}}
	gd, err := g.DecideGroup(context.Background(), nil, GroupRequest{Refs: refs, Costs: []int{4, 2}})
	if err != nil || !gd.Allowed || gd.Limits[0].Remaining != 1 || gd.Limits[1].Remaining != 1 {
		t.Fatalf("first: %+v %v", gd, err)
	}
	gd, err = g.DecideGroup(context.Background(), nil, GroupRequest{Refs: refs, Costs: []int{1, 2}})
	if err != nil || gd.Allowed || !gd.Limits[0].Allowed || gd.Limits[1].Allowed || gd.Limits[0].Remaining != 1 {
		t.Fatalf("second: %+v %v", gd, err)
	}
	ds, err := g.PeekRefs(context.Background(), nil, append(refs, Ref{0, "new"}))
	if err != nil || ds[0].Remaining != 1 || ds[1].Remaining != 1 || ds[2].Remaining != 5 {
		t.Fatalf("peek: %+v %v", ds, err)
	}
	if _, err := g.DecideGroup(context.Background(), nil, GroupRequest{Refs: refs, Costs: []int{6, 1}}); err == nil {
		t.Fatal("a cost above its limit was accepted")
	}
}
