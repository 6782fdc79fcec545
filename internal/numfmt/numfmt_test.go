package numfmt

import (
	"math"
	"testing"
)

func TestFormats(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{Ns(999), "999 ns"}, {Ns(3250), "3.25 µs"}, {Ns(1_500_000), "1.50 ms"},
		{SI(12), "12"}, {SI(4500), "4.5 k"}, {SI(1_250_000), "1.25 M"},
		{Commas(0), "0"}, {Commas(999), "999"}, {Commas(1000), "1,000"}, {Commas(-1234567), "-1,234,567"},
		{Commas(math.MinInt64), "-9,223,372,036,854,775,808"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

// TestScaled: the first unit a value reaches serves it; the last serves
// every other value, whatever its From.
func TestScaled(t *testing.T) {
	units := []Unit{{1e6, 1e6, "%gM"}, {10_000, 1e3, "%.1fk"}, {1e3, 1e3, "%.2fk"}, {1e9, 1, "%g"}}
	for _, c := range []struct {
		v    float64
		want string
	}{
		{2.5e6, "2.5M"}, {1e6, "1M"}, {999_999, "1000.0k"}, {12_345, "12.3k"}, {10_000, "10.0k"},
		{9_999, "10.00k"}, {1_000, "1.00k"}, {999, "999"}, {-3e6, "-3e+06"}, {math.NaN(), "NaN"},
	} {
		if got := Scaled(c.v, units...); got != c.want {
			t.Errorf("Scaled(%v) = %q, want %q", c.v, got, c.want)
		}
	}
}
