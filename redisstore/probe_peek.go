//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package redisstore

import (
	"net"
	"syscall"
	"time"
)

// answered reports whether c holds unread bytes or a close from its
// peer, without blocking: a non-blocking peek at the socket.
func answered(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	c.SetReadDeadline(time.Time{})
	got := false
	rc.Read(func(fd uintptr) bool {
		var b [1]byte
		// Without an error, n > 0 is a reply and n == 0 the peer's close.
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		got = err == nil
		return true
	})
	return got
}
