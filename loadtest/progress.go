package loadtest

import (
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// ui draws progress bars on long phases when enabled: by default only when
// stdout is a terminal, so that logs and pipes stay clean.
type ui struct {
	out     io.Writer
	enabled bool
}

func newUI(mode string, stdout io.Writer) *ui {
	u := &ui{out: stdout}
	switch mode {
	case "on":
		u.enabled = true
	case "auto":
		f, ok := stdout.(*os.File)
		u.enabled = ok && term.IsTerminal(int(f.Fd()))
	}
	return u
}

// progress is one bar, fed from a counter by its own goroutine.
type progress struct {
	pb   *progressbar.ProgressBar
	n    *atomic.Int64
	stop chan struct{}
	done chan struct{}
}

// bar starts a bar of total steps that follows n until finish.
func (u *ui) bar(total int64, desc string, n *atomic.Int64) *progress {
	if u == nil || !u.enabled {
		return &progress{}
	}
	p := &progress{
		pb: progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(u.out),
			progressbar.OptionSetDescription(desc),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		),
		n: n, stop: make(chan struct{}), done: make(chan struct{}),
	}
	go func() {
		defer close(p.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				_ = p.pb.Set64(min(p.n.Load(), total))
			}
		}
	}()
	return p
}

// finish stops the bar and clears it.
func (p *progress) finish() {
	if p.pb == nil {
		return
	}
	close(p.stop)
	<-p.done
	_ = p.pb.Set64(min(p.n.Load(), p.pb.GetMax64()))
	_ = p.pb.Finish()
}
