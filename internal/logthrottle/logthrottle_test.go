package logthrottle_test

import (
	"bytes"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/leakcheck"

	"github.com/slidegate/slidegate/internal/logthrottle"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Split(strings.TrimSpace(b.b.String()), "\n")
}

// accounted returns how many records the lines of msg stand for: one for
// a record written as it came, the count for a line of held-back ones.
func accounted(t *testing.T, lines []string, msg string) (records, written int) {
	t.Helper()
	for _, l := range lines {
		if !strings.Contains(l, "msg="+strconv.Quote(msg)) && !strings.Contains(l, "msg="+msg) {
			continue
		}
		written++
		_, after, ok := strings.Cut(l, "suppressed=")
		if !ok {
			records++
			continue
		}
		n, err := strconv.Atoi(strings.Fields(after)[0])
		if err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		records += n
	}
	return records, written
}

// TestFloodCounted: 10,000 records of one cause from 8 goroutines become
// a handful of lines whose counts add up to 10,000; another cause is
// logged on its own.
func TestFloodCounted(t *testing.T) {
	var buf buffer
	tl := logthrottle.New(slog.New(slog.NewTextHandler(&buf, nil)), time.Hour)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1250 {
				tl.Log(slog.LevelWarn, "store down", "the store is unavailable", "err", "connection refused")
			}
		}()
	}
	wg.Wait()
	tl.Log(slog.LevelWarn, "upstream down", "the upstream is unavailable")
	tl.Close()
	lines := buf.lines()
	records, written := accounted(t, lines, "the store is unavailable")
	if records != 10000 || written != 2 {
		t.Errorf("%d lines standing for %d records, want 2 for 10000:\n%s", written, records, strings.Join(lines, "\n"))
	}
	if r, w := accounted(t, lines, "the upstream is unavailable"); r != 1 || w != 1 {
		t.Errorf("the other cause: %d lines for %d records", w, r)
	}
}

// TestOncePerInterval: a steady failure is logged about once per
// interval, each line counting what it held back, and nothing is lost.
func TestOncePerInterval(t *testing.T) {
	var buf buffer
	tl := logthrottle.New(slog.New(slog.NewTextHandler(&buf, nil)), 20*time.Millisecond)
	const n = 300
	for range n {
		tl.Log(slog.LevelWarn, "", "boom")
		time.Sleep(time.Millisecond)
	}
	tl.Close()
	lines := buf.lines()
	records, written := accounted(t, lines, "boom")
	if records != n {
		t.Errorf("lines stand for %d records, want %d", records, n)
	}
	if written < 2 || written > n/2 {
		t.Errorf("%d lines for %d records over at least %d intervals", written, n, n/20)
	}
	t.Logf("%d records, %d lines", n, written)
}

// TestCausesBounded: causes that differ on every call share their
// message's entry once MaxCauses are tracked.
func TestCausesBounded(t *testing.T) {
	var buf buffer
	tl := logthrottle.New(slog.New(slog.NewTextHandler(&buf, nil)), time.Hour)
	const n = 5000
	for i := range n {
		tl.Log(slog.LevelWarn, "cause "+strconv.Itoa(i), "varying")
	}
	tl.Close()
	records, written := accounted(t, buf.lines(), "varying")
	if records != n || written > 2*logthrottle.MaxCauses+2 {
		t.Errorf("%d lines standing for %d records", written, records)
	}
}
