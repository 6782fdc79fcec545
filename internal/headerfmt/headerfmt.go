// Package headerfmt formats the values of the IETF RateLimit headers
// (draft-ietf-httpapi-ratelimit-headers) and Retry-After, for every
// package that writes them: httplimit (HTTP), grpclimit (gRPC metadata)
// and rls (headers Envoy adds to its response).
package headerfmt

import (
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
