package loadtest

import (
	"strconv"
)

// keyPrefix starts every client key the harness makes: client i is
// "client-<i>". The HTTP recorder maps keys back to indices by it.
const keyPrefix = "client-"

// clientKey returns the key of client i. Each call allocates a fresh string,
// so that a limiter populated with it owns its key's bytes, as it would in a
// server (the memory phase counts them).
func clientKey(i int) string {
	var buf [32]byte
	return string(strconv.AppendInt(append(buf[:0], keyPrefix...), int64(i), 10))
}

// clientIndex parses a key made by clientKey; ok is false for other keys.
// It allocates nothing: the recorder calls it for every decision the
// server under test makes, on the server's goroutines.
func clientIndex(key string) (int, bool) {
	if len(key) <= len(keyPrefix) || key[:len(keyPrefix)] != keyPrefix {
		return 0, false
	}
	// Canonical decimal only, as clientKey writes it: digits, no sign, no
	// leading zero.
	digits := key[len(keyPrefix):]
	if digits[0] < '0' || digits[0] > '9' || (digits[0] == '0' && len(digits) > 1) {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	if err != nil {
		return 0, false
	}
	return n, true
}
