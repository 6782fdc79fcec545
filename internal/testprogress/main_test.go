package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRealGoTest runs the real go test on a small module of two packages,
// one passing and one failing, and checks what a non-verbose go test would
// print, the start lines, and the exit status.
func TestRealGoTest(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.mod":            "module example.test/m\n\ngo 1.22\n",
		"good/good_test.go": "package good\n\nimport \"testing\"\n\nfunc TestGood(t *testing.T) { t.Log(\"quiet when passing\") }\n",
		"bad/bad_test.go": "package bad\n\nimport \"testing\"\n\nfunc TestGood(t *testing.T) { t.Log(\"quiet too\") }\n\n" +
			"func TestBad(t *testing.T) {\n\tt.Run(\"sub\", func(t *testing.T) { t.Error(\"the reason it failed\") })\n}\n",
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var stdout, stderr bytes.Buffer
	// run starts the command in the working directory; the module is dir.
	t.Chdir(dir)
	t.Setenv("GOFLAGS", "")
	t.Setenv("GOWORK", "off")
	code := run([]string{gobin, "test", "-count=1", "./..."}, &stdout, &stderr)
	out := stdout.String()
	if code != 1 {
		t.Errorf("exit status %d, want 1 (go test's); stderr %q", code, stderr.String())
	}
	for _, want := range []string{
		"start   example.test/m/good\n",
		"start   example.test/m/bad\n",
		"ok  \texample.test/m/good",
		"--- FAIL: TestBad/sub",
		"the reason it failed",
		"FAIL\texample.test/m/bad",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, not := range []string{"quiet when passing", "quiet too", "=== RUN", "\nPASS\n"} {
		if strings.Contains(out, not) {
			t.Errorf("output has %q, which go test without -v does not print:\n%s", not, out)
		}
	}
}

// TestBeat: a package running for a minute or more is named once per
// beat, with how long it has run; a package just started is not.
func TestBeat(t *testing.T) {
	now := time.Unix(1000, 0)
	var b bytes.Buffer
	p := newPrinter(&b, func() time.Time { return now })
	p.handle(event{Action: "start", Package: "a/slow"})
	now = now.Add(90 * time.Second)
	p.handle(event{Action: "start", Package: "a/fresh"})
	b.Reset()
	p.beat()
	if got, want := b.String(), "running a/slow (1m30s)\n"; got != want {
		t.Errorf("beat printed %q, want %q", got, want)
	}
	p.handle(event{Action: "pass", Package: "a/slow"})
	b.Reset()
	p.beat()
	if b.Len() != 0 {
		t.Errorf("beat after the package ended: %q", b.String())
	}
}

func TestWithJSON(t *testing.T) {
	got := strings.Join(withJSON([]string{"go", "test", "-race", "./..."}), " ")
	if got != "go test -json -race ./..." {
		t.Errorf("withJSON: %q", got)
	}
	got = strings.Join(withJSON([]string{"go", "test", "-json", "./..."}), " ")
	if got != "go test -json ./..." {
		t.Errorf("withJSON with -json: %q", got)
	}
}

// TestTimeoutOrder: the output of a test still running when its package
// fails (a timeout's panic) comes before the package's FAIL lines.
func TestTimeoutOrder(t *testing.T) {
	var b bytes.Buffer
	p := newPrinter(&b, time.Now)
	for _, e := range []event{
		{Action: "start", Package: "a/p"},
		{Action: "run", Package: "a/p", Test: "TestSlow"},
		{Action: "output", Package: "a/p", Test: "TestSlow", Output: "=== RUN   TestSlow\n"},
		{Action: "output", Package: "a/p", Test: "TestSlow", Output: "panic: test timed out after 10m0s\n"},
		{Action: "output", Package: "a/p", Output: "FAIL\ta/p\t600.1s\n"},
		{Action: "fail", Package: "a/p"},
	} {
		p.handle(e)
	}
	want := "start   a/p\npanic: test timed out after 10m0s\nFAIL\ta/p\t600.1s\n"
	if b.String() != want {
		t.Errorf("printed %q, want %q", b.String(), want)
	}
}
