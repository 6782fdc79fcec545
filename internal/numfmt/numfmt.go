// Package numfmt formats the figures of the load test's report and the
// results page the same way: durations in ns, µs or ms, rates with a k or
// M suffix, counts with thousands separators.
package numfmt

import (
	"fmt"
	"strconv"
	"strings"
)

// Ns formats ns nanoseconds as "812 ns", "3.25 µs" or "1.50 ms".
func Ns(ns int64) string {
	switch {
	case ns < 1000:
		return fmt.Sprintf("%d ns", ns)
	case ns < 1_000_000:
		return fmt.Sprintf("%.2f µs", float64(ns)/1e3)
	default:
		return fmt.Sprintf("%.2f ms", float64(ns)/1e6)
	}
}

// SI formats v as "12", "4.5 k" or "1.25 M".
func SI(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2f M", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1f k", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// Commas formats n with a comma between each group of three digits.
func Commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, ch := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(ch)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
