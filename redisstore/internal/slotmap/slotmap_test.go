package slotmap

import (
	"errors"
	"slices"
	"testing"
)

// TestMap: ranges give their slots to their master, masters are indexed
// in the order first seen, unnamed slots stay -1, and a range outside
// the slots or reversed is refused.
func TestMap(t *testing.T) {
	m := New()
	for _, r := range []struct {
		lo, hi int64
		addr   string
	}{{0, 99, "a:1"}, {200, NumSlots - 1, "b:2"}, {100, 149, "a:1"}} {
		if err := m.Add(r.lo, r.hi, r.addr); err != nil {
			t.Fatalf("Add(%d, %d, %s): %v", r.lo, r.hi, r.addr, err)
		}
	}
	if !slices.Equal(m.Addrs, []string{"a:1", "b:2"}) {
		t.Errorf("masters %v, want [a:1 b:2]", m.Addrs)
	}
	for _, c := range []struct{ slot, want int }{{0, 0}, {99, 0}, {149, 0}, {150, -1}, {199, -1}, {200, 1}, {NumSlots - 1, 1}} {
		if got := m.Owner[c.slot]; got != c.want {
			t.Errorf("slot %d owned by %d, want %d", c.slot, got, c.want)
		}
	}
	for _, r := range [][2]int64{{-1, 5}, {5, NumSlots}, {9, 8}} {
		if err := m.Add(r[0], r[1], "c:3"); !errors.Is(err, ErrMalformed) {
			t.Errorf("Add(%d, %d): %v, want ErrMalformed", r[0], r[1], err)
		}
	}
	if len(m.Addrs) != 2 {
		t.Errorf("a refused range added a master: %v", m.Addrs)
	}
}
