// Package logthrottle keeps a failing dependency from flooding the log:
// each cause is logged at most once per interval, and what was held back
// is logged once the interval ends, with a count. The server logs its
// store and upstream failures through it.
package logthrottle

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// DefaultInterval is how often one cause is logged at most.
const DefaultInterval = time.Second

// MaxCauses bounds the causes tracked at once, so that causes that differ
// on every request (an address, a key in the message) cannot grow the
// table: past it, a new cause shares the entry of its message alone.
const MaxCauses = 256

// Logger logs through an *slog.Logger, at most once per interval per
// cause. It is safe for concurrent use; Close logs what is held back and
// stops its timers.
type Logger struct {
	log      *slog.Logger
	interval time.Duration

	mu     sync.Mutex
	causes map[string]*window
	closed bool
}

// window is one cause's window: when it opened, and what it held back.
type window struct {
	timer      *time.Timer
	suppressed int
	level      slog.Level
	msg        string
	attrs      []any // of the latest held-back record
}

// New returns a Logger writing to l; interval ≤ 0 means DefaultInterval.
func New(l *slog.Logger, interval time.Duration) *Logger {
	if interval <= 0 {
		interval = DefaultInterval
	}
	return &Logger{log: l, interval: interval, causes: map[string]*window{}}
}

// Log logs msg with attrs at level, unless cause was logged within the
// interval: then it is counted, and when the interval ends one record
// with the latest attrs and "suppressed"=count is logged (counting the
// records held back since the last one written). cause names what failed
// (for example the message and the error's text); "" means msg.
func (t *Logger) Log(level slog.Level, cause, msg string, attrs ...any) {
	if cause == "" {
		cause = msg
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.log.Log(context.Background(), level, msg, attrs...)
		return
	}
	if c, ok := t.causes[cause]; ok {
		c.suppressed++
		c.level, c.msg, c.attrs = level, msg, attrs
		t.mu.Unlock()
		return
	}
	if len(t.causes) >= MaxCauses {
		if c, ok := t.causes[msg]; ok {
			c.suppressed++
			c.level, c.msg, c.attrs = level, msg, attrs
			t.mu.Unlock()
			return
		}
		cause = msg
	}
	c := &window{}
	c.timer = time.AfterFunc(t.interval, func() { t.flush(cause, c) })
	t.causes[cause] = c
	t.mu.Unlock()
	t.log.Log(context.Background(), level, msg, attrs...)
}

// flush ends c's window: it logs what c held back, if anything, and opens
// a new window then (so that a cause failing steadily logs once per
// interval), else forgets c.
func (t *Logger) flush(key string, c *window) {
	t.mu.Lock()
	if t.causes[key] != c {
		t.mu.Unlock()
		return
	}
	n, level, msg, attrs := c.suppressed, c.level, c.msg, c.attrs
	if n == 0 || t.closed {
		delete(t.causes, key)
	} else {
		c.suppressed, c.attrs = 0, nil
		c.timer.Reset(t.interval)
	}
	t.mu.Unlock()
	if n > 0 {
		t.log.Log(context.Background(), level, msg, append(append([]any(nil), attrs...), "suppressed", n)...)
	}
}

// Close logs every cause's held-back records now and stops the timers;
// later calls to Log write at once.
func (t *Logger) Close() {
	t.mu.Lock()
	t.closed = true
	causes := t.causes
	t.causes = map[string]*window{}
	t.mu.Unlock()
	for _, c := range causes {
		c.timer.Stop()
		t.mu.Lock()
		n, level, msg, attrs := c.suppressed, c.level, c.msg, c.attrs
		c.suppressed = 0
		t.mu.Unlock()
		if n > 0 {
			t.log.Log(context.Background(), level, msg, append(append([]any(nil), attrs...), "suppressed", n)...)
		}
	}
}
