package engine

import (
	"os/exec"
	"regexp"
	"testing"
)

// TestDecisionPathsInline checks that Allow, AllowN and AllowNAt stay
// small enough for the compiler to inline into their callers: a Decision
// returned by a call that is not inlined costs its caller a wait on the
// store buffer (see allow in engine.go), measured at a fifth of a hot
// key's decision. It builds this package with -gcflags=-m and reads the
// compiler's inlining report.
func TestDecisionPathsInline(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the package with the go command")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	out, err := exec.Command(goBin, "build", "-gcflags=-m", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build -gcflags=-m: %v\n%s", err, out)
	}
	for _, f := range []string{"Allow", "AllowN", "AllowNAt"} {
		re := regexp.MustCompile(`(?m)can inline \(\*Limiter\)\.` + f + `( with|$)`)
		if !re.Match(out) {
			t.Errorf("(*Limiter).%s is no longer inlinable; keep it a call to its unexported worker", f)
		}
	}
}
