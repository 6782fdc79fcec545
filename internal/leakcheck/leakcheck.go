// Package leakcheck finds goroutines that a test left running. It is the
// part of go.uber.org/goleak that the core module's tests use, kept here so
// that the core module requires nothing beyond what the engine links.
package leakcheck

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// settle is how long a check waits for goroutines to finish before it
// reports them: a goroutine that is already returning needs a moment.
const settle = 5 * time.Second

// Option narrows what counts as a leak.
type Option func(*config)

type config struct {
	ignoreIDs map[string]bool
	ignoreFns []string
}

// IgnoreCurrent ignores every goroutine running when it is called.
func IgnoreCurrent() Option {
	ids := map[string]bool{}
	for _, g := range stacks() {
		ids[g.id] = true
	}
	return func(c *config) {
		for id := range ids {
			c.ignoreIDs[id] = true
		}
	}
}

// IgnoreAnyFunction ignores goroutines with fn anywhere in their stack.
func IgnoreAnyFunction(fn string) Option {
	return func(c *config) { c.ignoreFns = append(c.ignoreFns, fn) }
}

// Find returns an error naming the goroutines still running after settle,
// other than the caller's own and the ones the options ignore.
func Find(opts ...Option) error { return findWithin(settle, opts...) }

func findWithin(wait time.Duration, opts ...Option) error {
	c := &config{ignoreIDs: map[string]bool{}}
	for _, o := range opts {
		o(c)
	}
	deadline := time.Now().Add(wait)
	delay := time.Millisecond
	for {
		left := leaked(c)
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			fmt.Fprintf(&b, "leakcheck: %d goroutines left running:", len(left))
			for _, g := range left {
				b.WriteString("\n\n")
				b.WriteString(g.stack)
			}
			return fmt.Errorf("%s", b.String())
		}
		time.Sleep(delay)
		if delay < 100*time.Millisecond {
			delay *= 2
		}
	}
}

// VerifyNone fails t when Find reports a leak. Use it with defer.
func VerifyNone(t testing.TB, opts ...Option) {
	t.Helper()
	if err := Find(opts...); err != nil {
		t.Error(err)
	}
}

// VerifyTestMain runs the tests and then fails the binary when a goroutine
// is left running.
func VerifyTestMain(m *testing.M, opts ...Option) {
	code := m.Run()
	if code == 0 {
		if err := Find(opts...); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

type goroutine struct {
	id    string
	stack string
}

func leaked(c *config) []goroutine {
	all := stacks()
	var out []goroutine
	for i, g := range all {
		if i == 0 || c.ignoreIDs[g.id] || system(g.stack) {
			continue // the first is the caller's own goroutine
		}
		skip := false
		for _, fn := range c.ignoreFns {
			if strings.Contains(g.stack, fn+"(") {
				skip = true
				break
			}
		}
		if !skip {
			out = append(out, g)
		}
	}
	return out
}

// system reports the goroutines the runtime and the testing package own.
func system(stack string) bool {
	for _, fn := range []string{
		"testing.RunTests(",
		"testing.(*T).Run(",
		"testing.(*T).Parallel(",
		"testing.(*M).Run(",
		"os/signal.signal_recv(",
		"os/signal.loop(",
		"runtime.ensureSigM(",
		"runtime/trace.Start(",
	} {
		if strings.Contains(stack, fn) {
			return true
		}
	}
	return false
}

func stacks() []goroutine {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []goroutine
	for _, chunk := range bytes.Split(buf, []byte("\n\n")) {
		s := string(chunk)
		// "goroutine 18 [running]:"
		head, _, _ := strings.Cut(s, "\n")
		f := strings.Fields(head)
		if len(f) < 2 || f[0] != "goroutine" {
			continue
		}
		out = append(out, goroutine{id: f[1], stack: s})
	}
	return out
}
