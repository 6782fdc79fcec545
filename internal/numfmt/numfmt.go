// Package numfmt formats the figures of the load test's report, the
// results page and the benchmark tables the same way: durations in ns, µs
// or ms, rates with a k or M suffix, counts with thousands separators.
// Scaled does the scaling for every table of units.
package numfmt

import (
	"fmt"
	"strconv"
	"strings"
)

// Unit is one step of a scale: Scaled shows a value of at least From
// divided by Div, through Format (a verb for one float64 and its unit).
type Unit struct {
	From, Div float64
	Format    string
}

// Scaled formats v with the first of units, largest first, whose From
// it reaches. The last unit serves every value the others do not
// (smaller ones, NaN); its From is not read.
func Scaled(v float64, units ...Unit) string {
	u := units[len(units)-1]
	for _, x := range units[:len(units)-1] {
		if v >= x.From {
			u = x
			break
		}
	}
	return fmt.Sprintf(u.Format, v/u.Div)
}

var (
	nsUnits = []Unit{{1e6, 1e6, "%.2f ms"}, {1e3, 1e3, "%.2f µs"}, {0, 1, "%.0f ns"}}
	siUnits = []Unit{{1e6, 1e6, "%.2f M"}, {1e3, 1e3, "%.1f k"}, {0, 1, "%.0f"}}
)

// Ns formats ns nanoseconds as "812 ns", "3.25 µs" or "1.50 ms".
func Ns(ns int64) string { return Scaled(float64(ns), nsUnits...) }

// SI formats v as "12", "4.5 k" or "1.25 M".
func SI(v float64) string { return Scaled(v, siUnits...) }

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
