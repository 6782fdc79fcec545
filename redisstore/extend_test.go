package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// Extend adds a policy of its own to a copy of a group: the copy decides
// the group's limits and the new one all or nothing in one call, sharing
// the state of the group's limiters; the group is unchanged; a policy
// whose keys would be those of a group's limiter is refused.
func TestExtend(t *testing.T) {
	url := standaloneURL(t)
	ctx := context.Background()
	st, ls, g := openGroup(t, url, []engine.Policy{{Name: "base", Limit: 3, Window: time.Minute}}, WithKeyPrefix(testPrefix(t)))
	defer st.Close()
	eg, nb, err := g.Extend(engine.Policy{Name: "extra", Limit: 2, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Policies()) != 1 || len(eg.Policies()) != 2 || eg.Policies()[1].Name != "extra" {
		t.Fatalf("policies: %v, extended %v", g.Policies(), eg.Policies())
	}
	refs := []engine.Ref{{Policy: 0, Key: "u"}, {Policy: 1, Key: "u"}}
	for i, want := range []bool{true, true, false} {
		gd, err := eg.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, Costs: []int{1, 1}})
		if err != nil || gd.Allowed != want {
			t.Fatalf("request %d: %+v %v, want allowed %v", i, gd, err, want)
		}
	}
	// The refusal by the new limit charged nothing to the group's limiter,
	// which holds the two allowed requests.
	if d, err := ls[0].Decide(ctx, "u", 1); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the group's limiter after the extended group: %+v %v", d, err)
	}
	if d, err := nb.(*Limiter).Decide(ctx, "u", 1); err != nil || d.Allowed {
		t.Fatalf("the new limiter: %+v %v", d, err)
	}
	if _, _, err := g.Extend(engine.Policy{Name: "base", Limit: 9, Window: time.Second}); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("a policy sharing the group's keys: %v", err)
	}
}
