package headerfmt

import (
	"strconv"
	"testing"
	"time"
)

func TestCeilSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		-time.Second: 0, 0: 0, 1: 1, time.Second: 1, time.Second + 1: 2, 59*time.Second + 999*time.Millisecond: 60,
	} {
		if got := CeilSeconds(d); got != want {
			t.Errorf("CeilSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

func TestSFString(t *testing.T) {
	for in, want := range map[string]string{
		"free": `"free"`, `a"b`: `"a\"b"`, `a\b`: `"a\\b"`, "tab\there": `"tab?here"`, "é": `"??"`, "": `""`,
	} {
		if got := SFString(in); got != want {
			t.Errorf("SFString(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestInt(t *testing.T) {
	for _, n := range []int64{-1, 0, 7, 1023, 1024, 1 << 40} {
		got := Int(n)
		if len(got) != 1 || got[0] != strconv.FormatInt(n, 10) {
			t.Errorf("Int(%d) = %q", n, got)
		}
		if shared := n >= 0 && n < 1024; shared != (&Int(n)[0] == &got[0]) {
			t.Errorf("Int(%d): shared %v, want %v", n, !shared, shared)
		}
		if cap(got) != 1 {
			t.Errorf("Int(%d): cap %d, want 1 (Add must not write into a shared slice)", n, cap(got))
		}
	}
}
