//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package redisstore

import (
	"errors"
	"net"
	"os"
	"time"
)

// answered reports whether c holds unread bytes or a close from its
// peer: a read with a short deadline, which returns at once when bytes
// are waiting.
func answered(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	var b [64]byte
	n, err := c.Read(b[:])
	return n > 0 || err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}
