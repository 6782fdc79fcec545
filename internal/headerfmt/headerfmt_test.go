package headerfmt

import (
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
