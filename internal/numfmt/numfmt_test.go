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
