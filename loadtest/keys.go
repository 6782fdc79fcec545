package loadtest

import (
	"strconv"
)

// KeyPrefix starts every client key the harness makes: client i is
// "client-<i>". The HTTP recorder maps keys back to indices by it.
const KeyPrefix = "client-"

// ClientKey returns the key of client i. Each call allocates a fresh string,
// so that a limiter populated with it owns its key's bytes, as it would in a
// server (the memory phase counts them).
func ClientKey(i int) string {
	var buf [32]byte
	return string(strconv.AppendInt(append(buf[:0], KeyPrefix...), int64(i), 10))
}

// clientIndex parses a key made by ClientKey; ok is false for other keys.
func clientIndex(key string) (int, bool) {
	if len(key) <= len(KeyPrefix) || key[:len(KeyPrefix)] != KeyPrefix {
		return 0, false
	}
	n, err := strconv.Atoi(key[len(KeyPrefix):])
	if err != nil || n < 0 || strconv.Itoa(n) != key[len(KeyPrefix):] {
		return 0, false
	}
	return n, true
}
