package connlimit

import (
	"errors"
	"os"
	"sync"
	"time"
)

// Lazy deadlines. net/http moves a keep-alive connection's read deadline
// six times per request (idle, header and whole-request timeouts, and the
// background read it starts and aborts around the handler) and its write
// deadline once. Each move is a runtime timer update under the poller's
// lock. Most moves push the deadline later, so a Conn passes to the
// socket only a deadline earlier than the one the socket has (or one that
// replaces an expired abort). A later one is kept as wanted: when the
// socket's earlier deadline fires, Read or Write sees the timeout, finds
// the wanted deadline still ahead, sets it on the socket and goes on.
//
// The socket's deadline is never later than the wanted one, so an
// operation still fails once the wanted deadline has passed. An operation
// never fails before it: a timeout that comes early is retried.

// lazyDeadline is one direction's deadline. The zero time is "none",
// later than any other.
type lazyDeadline struct {
	want  time.Time // what the caller asked for last
	armed time.Time // what the socket has
	// prev is the socket's deadline before an abort (a deadline already
	// past when it was set); expired says that the socket has such a
	// deadline.
	prev    time.Time
	expired bool
}

// later reports whether a is later than b, the zero time being the
// latest.
func later(a, b time.Time) bool {
	if a.IsZero() {
		return !b.IsZero()
	}
	return !b.IsZero() && a.After(b)
}

// set records t as wanted and says which deadline the socket must get
// now, if any (ok false: the socket's deadline stays).
func (d *lazyDeadline) set(t time.Time) (arm time.Time, ok bool) {
	d.want = t
	if d.expired {
		// An abort's deadline is on the socket: every operation
		// would fail. Put back the one it replaced, or t if earlier.
		if later(d.prev, t) {
			return d.arm(t), true
		}
		// The one it replaced goes back as it was: not past when it was
		// armed, like any armed deadline that may have passed since (an
		// operation's timeout then retries with the wanted one). No
		// clock read.
		d.expired = false
		d.armed = d.prev
		return d.prev, true
	}
	if !later(d.armed, t) {
		return time.Time{}, false // the socket's fires first, or as t
	}
	return d.arm(t), true
}

// clockNow reads the clock for the deadlines (a variable for the tests
// that count its reads).
var clockNow = time.Now

// longPast is an instant every clock in use has passed. net/http aborts
// its background read with a deadline before it (the Unix epoch's first
// second), once per request: such a deadline is known to be past without
// a clock read.
var longPast = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// passed reports whether the deadline t (not the zero time) has passed,
// reading the clock only for a deadline after longPast.
func passed(t time.Time) bool {
	return t.Before(longPast) || !t.After(clockNow())
}

// arm records t as the socket's deadline and returns it.
func (d *lazyDeadline) arm(t time.Time) time.Time {
	if !t.IsZero() && passed(t) {
		if !d.expired {
			d.prev = d.armed
		}
		d.expired = true
	} else {
		d.expired = false
	}
	d.armed = t
	return t
}

// retry says, after an operation timed out, whether the wanted deadline
// is still ahead, and then which deadline the socket must get.
func (d *lazyDeadline) retry() (arm time.Time, ok bool) {
	if !d.want.IsZero() && passed(d.want) {
		return time.Time{}, false // the timeout is the wanted one
	}
	d.expired = false // an abort's deadline, if any, is replaced
	d.armed = d.want
	return d.want, true
}

// deadlines are a Conn's read and write deadlines.
type deadlines struct {
	mu          sync.Mutex
	read, write lazyDeadline
}

// SetReadDeadline implements net.Conn: see lazyDeadline.
func (c *Conn) SetReadDeadline(t time.Time) error {
	return c.setDeadline(&c.dl.read, t, c.Conn.SetReadDeadline)
}

// SetWriteDeadline implements net.Conn: see lazyDeadline.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	return c.setDeadline(&c.dl.write, t, c.Conn.SetWriteDeadline)
}

// setDeadline records t as d's wanted deadline and passes to the socket
// the deadline it must get now, if any.
func (c *Conn) setDeadline(d *lazyDeadline, t time.Time, setOnSocket func(time.Time) error) error {
	c.dl.mu.Lock()
	arm, ok := d.set(t)
	var err error
	if ok {
		err = setOnSocket(arm)
	}
	c.dl.mu.Unlock()
	return err
}

// SetDeadline implements net.Conn.
func (c *Conn) SetDeadline(t time.Time) error {
	return errors.Join(c.SetReadDeadline(t), c.SetWriteDeadline(t))
}

// Read implements net.Conn: a timeout of a deadline that is no longer
// wanted is retried.
func (c *Conn) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		if n > 0 || err == nil || !errors.Is(err, os.ErrDeadlineExceeded) || !c.rearm(&c.dl.read, c.Conn.SetReadDeadline) {
			return n, err
		}
	}
}

// Write implements net.Conn: a timeout of a deadline that is no longer
// wanted is retried with the rest of p.
func (c *Conn) Write(p []byte) (int, error) {
	written := 0
	for {
		n, err := c.Conn.Write(p[written:])
		written += n
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) || !c.rearm(&c.dl.write, c.Conn.SetWriteDeadline) {
			return written, err
		}
	}
}

// rearm sets d's wanted deadline on the socket after a timeout, unless
// it has passed: false then, and the timeout stands.
func (c *Conn) rearm(d *lazyDeadline, setOnSocket func(time.Time) error) bool {
	c.dl.mu.Lock()
	defer c.dl.mu.Unlock()
	arm, ok := d.retry()
	if !ok {
		return false
	}
	return setOnSocket(arm) == nil
}
