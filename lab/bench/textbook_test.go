package bench

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// decider is what both textbook variants offer.
type decider interface {
	AllowNAt(key string, n int, now int64) engine.Decision
}

func newTextbooks(t *testing.T, limit int, window time.Duration) map[string]decider {
	t.Helper()
	tb, err := NewTextbook(limit, window)
	if err != nil {
		t.Fatal(err)
	}
	st, err := NewShardedTextbook(limit, window)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]decider{"textbook": tb, "sharded": st}
}

// The basic trace: L = 2, W = 60 s.
func TestTextbookBasicTrace(t *testing.T) {
	s := int64(time.Second)
	steps := []struct {
		at    int64
		allow bool
	}{
		{0, true},       // empty log
		{1 * s, true},   // second entry
		{2 * s, false},  // full; RetryAfter = 0 + 60 − 2
		{60 * s, true},  // the entry at 0 expired exactly W ago
		{60 * s, false}, // entries 1 and 60 live
		{61 * s, true},  // the entry at 1 expired
	}
	for name, d := range newTextbooks(t, 2, time.Minute) {
		for i, st := range steps {
			got := d.AllowNAt("k", 1, st.at)
			if got.Allowed != st.allow {
				t.Fatalf("%s step %d at %ds: allowed %v, want %v", name, i, st.at/s, got.Allowed, st.allow)
			}
			if i == 2 && got.RetryAfter != 58*time.Second {
				t.Fatalf("%s step 2: RetryAfter %v, want 58s", name, got.RetryAfter)
			}
		}
	}
}

// Every Decision field against the reference deque model on random traces
// with equal instants, exact-W jumps and costs above 1.
func TestTextbookMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for trial := range 50 {
		limit := 1 + r.IntN(8)
		window := int64(1 + r.IntN(100))
		for name, d := range newTextbooks(t, limit, time.Duration(window)) {
			ref := reference.NewLog(limit, window)
			now := int64(0)
			for step := range 400 {
				switch r.IntN(4) {
				case 0: // same instant
				case 1:
					now += window // exactly W
				default:
					now += int64(r.IntN(int(window)))
				}
				key := string(rune('a' + r.IntN(4)))
				n := 1 + r.IntN(limit)
				want := ref.Decide(key, n, now)
				got := d.AllowNAt(key, n, now)
				if got.Allowed != want.Allowed || got.Remaining != want.Remaining ||
					int64(got.RetryAfter) != want.RetryAfter || int64(got.Reset) != want.Reset {
					t.Fatalf("%s trial %d step %d (L=%d W=%d key %q n=%d t=%d): got %+v, want %+v",
						name, trial, step, limit, window, key, n, now, got, want)
				}
			}
		}
	}
}

func TestTextbookRejectsBadPolicy(t *testing.T) {
	for _, c := range []struct {
		limit  int
		window time.Duration
	}{{0, time.Second}, {1, 0}, {engine.MaxLogLimit + 1, time.Second}} {
		if _, err := NewTextbook(c.limit, c.window); err == nil {
			t.Errorf("NewTextbook(%d, %v): no error", c.limit, c.window)
		}
		if _, err := NewShardedTextbook(c.limit, c.window); err == nil {
			t.Errorf("NewShardedTextbook(%d, %v): no error", c.limit, c.window)
		}
	}
}

func TestTextbookRingGrowsToLimitOnly(t *testing.T) {
	tb, err := NewTextbook(5, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 7 {
		tb.AllowNAt("k", 1, int64(i))
	}
	if c := len(tb.keys["k"].buf); c != 5 {
		t.Fatalf("ring capacity %d, want 5", c)
	}
	if n := tb.Keys(); n != 1 {
		t.Fatalf("Keys() = %d, want 1", n)
	}
}

// The clock is read outside the lock, so a goroutine may bring an older
// instant than the key's newest entry; the key's time must not go back.
func TestTextbookClampsTime(t *testing.T) {
	tb, err := NewTextbook(1, 10)
	if err != nil {
		t.Fatal(err)
	}
	tb.AllowNAt("k", 1, 100)
	d := tb.AllowNAt("k", 1, 50)
	if d.Allowed || d.At != 100 || d.RetryAfter != 10 {
		t.Fatalf("late arrival: %+v, want refused at 100 with RetryAfter 10", d)
	}
}
