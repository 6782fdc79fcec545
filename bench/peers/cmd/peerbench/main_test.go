package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRunSmall(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"-keys", "500", "-rounds", "1", "-duration", "2ms", "-skip-exact", "-heap-objects", "1000", "-q", "-peers", "textbook, go-limiter"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	s := out.String()
	for _, want := range []string{"Machine: ", "| slidegate |", "| textbook |", "| go-limiter |", "command: `cd bench/peers && go run ./cmd/peerbench -keys 500"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "| throttled |") {
		t.Errorf("unselected peer in the table:\n%s", s)
	}
}

func TestRunBadInput(t *testing.T) {
	for _, args := range [][]string{{"-peers", "nope"}, {"-bogus"}, {"-rounds", "-1", "-q"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code == 0 {
			t.Errorf("%v: exit 0", args)
		} else if errb.Len() == 0 {
			t.Errorf("%v: no message", args)
		}
	}
}
