package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/slidegate/slidegate/engine"
)

// TestSlotTags: every slot has a tag of at most three characters, without
// braces, whose CRC16 is that slot, as the real cluster computes it.
func TestSlotTags(t *testing.T) {
	tags := slotTags()
	for s, tag := range tags {
		if tag == "" || len(tag) > 3 || strings.ContainsAny(tag, "{}") || int(crc16([]byte(tag))%numSlots) != s {
			t.Fatalf("slot %d: tag %q", s, tag)
		}
	}
	c := rawClient(t, clusterAddrs(t)[0])
	ctx := context.Background()
	for s := 0; s < numSlots; s += 997 {
		got, err := c.Do(ctx, c.B().ClusterKeyslot().Key("x:{"+tags[s]+"}y").Build()).AsInt64()
		if err != nil || int(got) != s {
			t.Fatalf("CLUSTER KEYSLOT of tag %q: %d %v, want %d", tags[s], got, err, s)
		}
	}
}

// adversarialKeys returns n client keys shaped to share a hash tag under
// a scheme that let client keys choose it: "tenant}N", "a{b}N", "{x}N" and
// the like.
func adversarialKeys(n int) []string {
	shapes := []string{"tenant}%d", "a{b}%d", "{x}%d", "%d{", "{}%d", "}{%d", "{same}%d", "\x00{\xff}%d", "%d"}
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(shapes[i%len(shapes)], i)
	}
	return out
}

// keySlots asks the cluster for the slot of each key (CLUSTER KEYSLOT, in
// one pipeline) and returns how many keys each slot got.
func keySlots(t *testing.T, c rueidis.Client, keys []string) map[int64]int {
	t.Helper()
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = c.B().ClusterKeyslot().Key(k).Build()
	}
	per := map[int64]int{}
	for i, r := range c.DoMulti(context.Background(), cmds...) {
		s, err := r.AsInt64()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", keys[i], err)
		}
		per[s]++
	}
	return per
}

func maxCount(m map[int64]int) int {
	x := 0
	for _, v := range m {
		x = max(x, v)
	}
	return x
}

// TestSlotSpread: 10,000 adversarial client keys spread over the slots
// like random ones (no slot holds more than 1% of them) through both
// algorithms' keys, where letting the client key be the tag piled them
// into a handful of slots. Keys decided with one tag share one slot.
// Policy names with braces are refused.
func TestSlotSpread(t *testing.T) {
	url := clusterURL(t)
	c := rawClient(t, clusterAddrs(t)[0])
	keys := adversarialKeys(10000)
	old := make([]string, len(keys))
	for i, k := range keys {
		old[i] = "slidegate:free:{" + k + "}" // the previous key scheme
	}
	oldMax := maxCount(keySlots(t, c, old))
	for _, alg := range []engine.Algorithm{engine.SlidingLog, engine.SlidingCounter} {
		l := newTestLimiter(t, url, engine.Policy{Name: "spread", Limit: 2, Window: time.Minute, Algorithm: alg})
		redisKeys := make([]string, len(keys))
		for i, k := range keys {
			redisKeys[i] = l.Key(k)
		}
		per := keySlots(t, c, redisKeys)
		m := maxCount(per)
		t.Logf("algorithm %d: 10,000 adversarial keys in %d slots, at most %d in one (client key as the tag: at most %d)", alg, len(per), m, oldMax)
		if m > len(keys)/100 {
			t.Errorf("a slot holds %d of %d keys (more than 1%%)", m, len(keys))
		}
		// They decide on the cluster like any key.
		for _, k := range keys[:90] {
			if d, err := l.Decide(context.Background(), k, 1); err != nil || !d.Allowed {
				t.Fatalf("key %q: %+v %v", k, d, err)
			}
		}
	}
	if oldMax <= len(keys)/100 {
		t.Errorf("the client-chosen tag spread the keys too (at most %d per slot): the keys are not adversarial", oldMax)
	}
	// One tag, one slot, for any keys and policies.
	a := newTestLimiter(t, url, engine.Policy{Name: "per_second", Limit: 2, Window: time.Second})
	b := newTestLimiter(t, url, engine.Policy{Name: "per_hour", Limit: 2, Window: time.Hour, Algorithm: engine.SlidingCounter})
	tagged := []string{a.TaggedKey("user-7", "user-7"), b.TaggedKey("user-7", "10.0.0.1"), a.TaggedKey("user-7", "x}{y")}
	if per := keySlots(t, c, tagged); len(per) != 1 {
		t.Errorf("keys of one tag in %d slots: %v", len(per), per)
	}
	if d, err := b.DecideTagged(context.Background(), "user-7", "10.0.0.1", 1); err != nil || !d.Allowed {
		t.Errorf("DecideTagged: %+v %v", d, err)
	}
	for _, name := range []string{"a{b", "a}b", "{}"} {
		if _, err := New(url, engine.Policy{Name: name, Limit: 1, Window: time.Second}); !errors.Is(err, engine.ErrInvalidPolicy) {
			t.Errorf("policy name %q: %v, want ErrInvalidPolicy", name, err)
		}
	}
}
