// Command testprogress runs `go test -json …` and prints what a
// non-verbose `go test` prints (each package's ok or FAIL line, the output
// of failed tests, build errors) plus one line when each package starts
// and, while a package runs longer than a minute, one line a minute
// naming it, so that a long package is not silence.
//
//	go run ./internal/testprogress go test -race ./...
//
// It adds -json after `test` when it is missing, passes stderr through,
// and exits with the command's exit status.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/slidegate/slidegate/internal/tick"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: testprogress go test [flags] [packages]")
		os.Exit(2)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// heartbeat is how often a line names the packages still running.
const heartbeat = time.Minute

func run(args []string, stdout, stderr io.Writer) int {
	args = withJSON(args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stderr = stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(stderr, "testprogress:", err)
		return 2
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "testprogress:", err)
		return 2
	}
	p := newPrinter(stdout, time.Now)
	done := make(chan struct{})
	go tick.Every(done, heartbeat, p.beat)
	p.consume(out)
	close(done)
	err = cmd.Wait()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		fmt.Fprintln(stderr, "testprogress:", err)
		return 2
	}
	return 0
}

// withJSON adds -json right after "test" unless the arguments have it.
func withJSON(args []string) []string {
	if slices.Contains(args, "-json") {
		return args
	}
	i := slices.Index(args, "test")
	if i < 0 {
		return args
	}
	return slices.Concat(args[:i+1], []string{"-json"}, args[i+1:])
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string // build-output and build-fail events
}

// printer turns events into go test's non-verbose output and the
// progress lines. It is safe for the heartbeat goroutine to call beat
// while consume runs.
type printer struct {
	mu      sync.Mutex
	w       io.Writer
	now     func() time.Time
	running map[string]time.Time           // package → when it started
	tests   map[string]map[string][]string // package → test → output lines
}

func newPrinter(w io.Writer, now func() time.Time) *printer {
	return &printer{w: w, now: now, running: map[string]time.Time{}, tests: map[string]map[string][]string{}}
}

// consume reads events until r ends. A line that is not an event is
// printed as it is.
func (p *printer) consume(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			p.mu.Lock()
			fmt.Fprintf(p.w, "%s\n", line)
			p.mu.Unlock()
			continue
		}
		p.handle(e)
	}
}

func (p *printer) handle(e event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case e.Action == "build-output":
		io.WriteString(p.w, e.Output)
	case e.Action == "start":
		p.running[e.Package] = p.now()
		fmt.Fprintf(p.w, "start   %s\n", e.Package)
	case e.Test == "" && e.Action == "output":
		// The package's own lines: ok/FAIL, panics, a timeout. The bare
		// PASS line is not printed, as go test without -v does not.
		if strings.HasPrefix(e.Output, "FAIL") {
			// Tests still running when their package fails (a timeout's
			// panic is their output) show before its FAIL lines, as go
			// test prints them.
			for _, name := range slices.Sorted(maps.Keys(p.tests[e.Package])) {
				p.flush(e.Package, name)
			}
		}
		if e.Output != "PASS\n" {
			io.WriteString(p.w, e.Output)
		}
	case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
		delete(p.running, e.Package)
		// A test that never ended (a timeout's panic) still shows.
		for _, name := range slices.Sorted(maps.Keys(p.tests[e.Package])) {
			p.flush(e.Package, name)
		}
		delete(p.tests, e.Package)
	case e.Action == "output":
		ts := p.tests[e.Package]
		if ts == nil {
			ts = map[string][]string{}
			p.tests[e.Package] = ts
		}
		ts[e.Test] = append(ts[e.Test], e.Output)
	case e.Action == "fail":
		p.flush(e.Package, e.Test)
	case e.Action == "pass" || e.Action == "skip":
		delete(p.tests[e.Package], e.Test)
	}
}

// flush prints a failed test's output (without the === framing lines
// that only -v shows) and forgets it. Its caller holds mu.
func (p *printer) flush(pkg, test string) {
	for _, l := range p.tests[pkg][test] {
		if strings.HasPrefix(l, "=== ") {
			continue
		}
		io.WriteString(p.w, l)
	}
	delete(p.tests[pkg], test)
}

// beat prints one line naming the packages that have run for a minute or
// more, with how long each has run.
func (p *printer) beat() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	var long []string
	for _, pkg := range slices.Sorted(maps.Keys(p.running)) {
		if d := now.Sub(p.running[pkg]); d >= heartbeat {
			long = append(long, fmt.Sprintf("%s (%v)", pkg, d.Round(time.Second)))
		}
	}
	if len(long) > 0 {
		fmt.Fprintf(p.w, "running %s\n", strings.Join(long, ", "))
	}
}
