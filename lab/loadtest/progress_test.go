package loadtest

import (
	"bytes"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestProgressQuietOffTerminal: status lines are redrawn only when asked
// or when stdout is a terminal; a pipe or buffer gets one line per step.
func TestProgressQuietOffTerminal(t *testing.T) {
	var buf bytes.Buffer
	if newUI("auto", &buf).bars {
		t.Error("auto: enabled on a buffer")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if newUI("auto", w).bars {
		t.Error("auto: enabled on a pipe")
	}
	if u := newUI("off", w); u.bars || u.lines {
		t.Error("off: enabled")
	}

	u := newUI("on", &buf)
	var n atomic.Int64
	n.Store(50)
	b := u.bar(100, "phase", &n)
	b.finish()
	if !bytes.Contains(buf.Bytes(), []byte("phase")) {
		t.Errorf("on: nothing drawn: %q", buf.String())
	}
	// A disabled bar is a no-op.
	buf.Reset()
	newUI("off", &buf).bar(10, "x", &n).finish()
	newUI("off", &buf).step("y")
	if buf.Len() != 0 {
		t.Errorf("off printed %q", buf.String())
	}
}

// TestProgressPiped: off a terminal each step prints exactly one line,
// with no carriage return or escape sequence.
func TestProgressPiped(t *testing.T) {
	var buf bytes.Buffer
	u := newUI("auto", &buf)
	var n atomic.Int64
	n.Store(4000)
	u.bar(4000, "engine: decisions", &n).finish()
	u.step("capacity round %d: %s", 1, "held")
	out := buf.String()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "  engine: decisions: 4,000 of 4,000 in ") || lines[1] != "  capacity round 1: held" {
		t.Errorf("piped output %q", out)
	}
	if strings.ContainsAny(out, "\r\x1b") {
		t.Errorf("piped output redraws: %q", out)
	}
}

// TestProgressStatus: the status line's count, share and rate are the
// counter's, over the time since the step began.
func TestProgressStatus(t *testing.T) {
	var n atomic.Int64
	n.Store(3_000_000)
	now := time.Now()
	p := &progress{desc: "engine: decisions", total: 4_000_000, n: &n, start: now.Add(-2 * time.Second)}
	if got, want := p.status(now), "engine: decisions: 3,000,000 of 4,000,000 (75%), 1.50 M/s, 2s"; got != want {
		t.Errorf("status %q, want %q", got, want)
	}
}
