package loadtest

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/term"

	"github.com/slidegate/slidegate/internal/tick"
)

// ui shows a run's progress. On a terminal (or with --progress on) a long
// step draws one status line that it redraws in place: its count, share,
// rate and elapsed time. Off a terminal (a pipe, a log) nothing is
// redrawn; each step prints one line when it ends instead. --progress off
// prints neither.
type ui struct {
	mu    sync.Mutex
	out   io.Writer
	bars  bool // redraw a status line in place
	lines bool // one line per finished step
	drawn bool // a status line is on screen
}

func newUI(mode string, stdout io.Writer) *ui {
	u := &ui{out: stdout}
	switch mode {
	case "on":
		u.bars, u.lines = true, true
	case "auto":
		f, ok := stdout.(*os.File)
		u.bars = ok && term.IsTerminal(int(f.Fd()))
		u.lines = true
	}
	return u
}

// barInterval is how often a status line is redrawn.
const barInterval = 200 * time.Millisecond

// progress is one step's status line, fed from a counter by its own
// goroutine.
type progress struct {
	u     *ui
	desc  string
	total int64
	n     *atomic.Int64
	start time.Time
	stop  chan struct{}
	done  chan struct{}
}

// bar starts the status line of a step of total units that follows n
// until finish.
func (u *ui) bar(total int64, desc string, n *atomic.Int64) *progress {
	if u == nil || (!u.bars && !u.lines) {
		return &progress{}
	}
	p := &progress{u: u, desc: desc, total: total, n: n, start: time.Now()}
	if !u.bars {
		return p
	}
	p.stop, p.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(p.done)
		tick.Every(p.stop, barInterval, func() { u.draw(p.status(time.Now())) })
	}()
	return p
}

// status is the step's line: description, count of total, share, rate
// and elapsed time.
func (p *progress) status(now time.Time) string {
	n := min(p.n.Load(), p.total)
	el := now.Sub(p.start)
	share := 0.0
	if p.total > 0 {
		share = 100 * float64(n) / float64(p.total)
	}
	rate := 0.0
	if s := el.Seconds(); s > 0 {
		rate = float64(n) / s
	}
	return fmt.Sprintf("%s: %s of %s (%.0f%%), %s/s, %s", p.desc, commas(n), commas(p.total), share, si(rate), el.Round(100*time.Millisecond))
}

// finish stops the status line, clears it and prints the step's line.
func (p *progress) finish() {
	if p.u == nil {
		return
	}
	if p.stop != nil {
		close(p.stop)
		<-p.done
	}
	n := p.n.Load()
	el := time.Since(p.start)
	rate := 0.0
	if s := el.Seconds(); s > 0 {
		rate = float64(n) / s
	}
	p.u.step("%s: %s of %s in %s (%s/s)", p.desc, commas(n), commas(p.total), el.Round(time.Millisecond), si(rate))
}

// draw replaces the status line with s.
func (u *ui) draw(s string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	fmt.Fprintf(u.out, "\r\x1b[K%s", s)
	u.drawn = true
}

// step prints one line for a finished step (clearing a status line first)
// unless --progress is off.
func (u *ui) step(format string, args ...any) {
	if u == nil || (!u.bars && !u.lines) {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.drawn {
		io.WriteString(u.out, "\r\x1b[K")
		u.drawn = false
	}
	fmt.Fprintf(u.out, "  "+format+"\n", args...)
}
