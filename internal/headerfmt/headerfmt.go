// Package headerfmt formats the values of the IETF RateLimit headers
// (draft-ietf-httpapi-ratelimit-headers) and Retry-After, for every
// package that writes them: httplimit (HTTP), grpclimit (gRPC metadata)
// and rls (headers Envoy adds to its response).
package headerfmt

import (
	"strconv"
	"strings"
	"time"
)

// CeilSeconds is d in whole seconds, rounded up; 0 for d ≤ 0. Rounding up
// keeps a client that waits the header's value from coming back early.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// SFString renders s as a structured-field string (RFC 8941): printable
// ASCII in double quotes, with " and \ escaped; any other byte becomes '?'
// (policy names are printable ASCII already; this keeps a header valid
// whatever it is given).
func SFString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// sharedInts bounds the table of shared values behind Int: 0 … 1023
// covers the remaining counts, Retry-After seconds and body lengths of
// nearly every response. The table costs about 40 KiB, once per process.
const sharedInts = 1024

var ints = func() [][]string {
	vals := make([]string, sharedInts)
	out := make([][]string, sharedInts)
	for i := range vals {
		vals[i] = strconv.Itoa(i)
		out[i] = vals[i : i+1 : i+1]
	}
	return out
}()

// Int returns n as a header value, []string{"n"}, for http.Header's map.
// For 0 ≤ n < 1024 the slice is preformatted and shared by every caller
// and response, so that writing it costs no allocation. That is safe for
// everything http.Header offers (Set and Del replace a slice, and Add
// appends to a copy, since each slice is capped at its length), but not
// for writing into the slice in place, which no handler should do. Other
// values are formatted into a new slice.
func Int(n int64) []string {
	if n >= 0 && n < sharedInts {
		return ints[n]
	}
	return []string{strconv.FormatInt(n, 10)}
}
