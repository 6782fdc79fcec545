package redisstore

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// serverCPU returns the Redis CPU (used_cpu_sys + used_cpu_user, µs)
// summed over addrs.
func serverCPU(tb testing.TB, addrs []string) float64 {
	tb.Helper()
	var cpu float64
	for _, a := range addrs {
		user, sys := serverCPUParts(tb, a)
		cpu += user + sys
	}
	return cpu
}

// serverCPUParts returns used_cpu_user and used_cpu_sys of addr, in µs.
func serverCPUParts(tb testing.TB, addr string) (user, sys float64) {
	tb.Helper()
	out, err := cli(addr, "info", "cpu")
	if err != nil {
		tb.Fatalf("INFO cpu on %s: %v: %s", addr, err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			tb.Fatalf("INFO cpu: %q: %v", line, err)
		}
		if k == "used_cpu_user" {
			user = f * 1e6
		} else {
			sys = f * 1e6
		}
	}
	return user, sys
}

// decideAll decides calls (client keys, cost 1) from callers
// goroutines, each taking the next call in the list.
func decideAll(tb testing.TB, l *Limiter, calls []string, callers int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(len(calls)); i = next.Add(1) - 1 {
				if _, err := l.Decide(context.Background(), calls[i], 1); err != nil {
					tb.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkScriptPaths measures the Redis CPU per decision of the two
// ways the store runs its scripts, FCALL of the loaded library and
// EVALSHA (where Functions are refused), in one run: rounds alternate
// between the paths, each round deciding on fresh keys with 64 callers,
// the refusal cache off. Three kinds of decision, each on its own keys:
// new (a key's first request), allowed (requests 2 to 50 of keys with L =
// 100) and refused (a full key, L = 10). It reports the medians of the
// rounds, µs of Redis CPU (INFO cpu) per decision.
//
//	scripts/redis-env.sh go test -run '^$' -bench ScriptPaths -benchtime 1x ./redisstore/
func BenchmarkScriptPaths(b *testing.B) {
	const rounds, keys = 5, 4000
	for _, dep := range []struct {
		name  string
		url   string
		addrs []string
	}{
		{"standalone", standaloneURL(b), []string{standaloneAddr(b)}},
		{"cluster", clusterURL(b), clusterAddrs(b)},
	} {
		b.Run(dep.name, func(b *testing.B) {
			open := func(fn bool) *Store {
				// A store opened with functionsOff keeps EVALSHA.
				off := functionsOff
				functionsOff = !fn
				s, err := Open(dep.url, WithKeyPrefix(testPrefix(b)), WithTimeout(5*time.Second), WithRefusalCache(0))
				functionsOff = off
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { s.Close() })
				if s.conn.(functionConn).functions() != fn {
					b.Skipf("FCALL %v, want %v: the server refuses Functions", !fn, fn)
				}
				return s
			}
			paths := map[string]*Store{"fcall": open(true), "evalsha": open(false)}
			defer func() {
				// Both paths throughout: the EVALSHA store never loads the
				// library.
				if paths["evalsha"].conn.(functionConn).functions() {
					b.Error("the EVALSHA store turned to FCALL")
				}
			}()
			cpu := map[string][]float64{}
			// run makes the decisions of one kind, calls from 64 callers,
			// and returns the Redis CPU per decision.
			run := func(l *Limiter, calls []string) float64 {
				c0 := serverCPU(b, dep.addrs)
				decideAll(b, l, calls, benchCallers)
				return (serverCPU(b, dep.addrs) - c0) / float64(len(calls))
			}
			for r := range rounds {
				for _, path := range []string{"fcall", "evalsha"} {
					if r%2 == 1 {
						path = map[string]string{"fcall": "evalsha", "evalsha": "fcall"}[path]
					}
					st := paths[path]
					l, err := st.Limiter(engine.Policy{Name: fmt.Sprintf("a%d", r), Limit: 100, Window: time.Minute})
					if err != nil {
						b.Fatal(err)
					}
					var calls []string
					for i := range keys {
						calls = append(calls, "k"+strconv.Itoa(i))
					}
					cpu[path+" new"] = append(cpu[path+" new"], run(l, calls))
					calls = calls[:0]
					for range 49 {
						for i := range keys / 20 {
							calls = append(calls, "k"+strconv.Itoa(i))
						}
					}
					cpu[path+" allowed"] = append(cpu[path+" allowed"], run(l, calls))
					f, err := st.Limiter(engine.Policy{Name: fmt.Sprintf("f%d", r), Limit: 10, Window: time.Minute})
					if err != nil {
						b.Fatal(err)
					}
					calls = calls[:0]
					for i := range keys / 20 {
						for range 10 {
							calls = append(calls, "k"+strconv.Itoa(i))
						}
					}
					run(f, calls) // fill
					calls = calls[:0]
					for range 10 {
						for i := range keys / 20 {
							calls = append(calls, "k"+strconv.Itoa(i))
						}
					}
					cpu[path+" refused"] = append(cpu[path+" refused"], run(f, calls))
				}
			}
			for _, kind := range []string{"new", "allowed", "refused"} {
				for _, path := range []string{"fcall", "evalsha"} {
					xs := slices.Clone(cpu[path+" "+kind])
					slices.Sort(xs)
					b.ReportMetric(xs[len(xs)/2], path+"-"+kind+"-cpu-us/decision")
				}
			}
		})
	}
}

// callgrindCounter returns a function that reads the instructions
// callgrind counted so far in the main thread of the server pid, at addr.
// Valgrind answers callgrind_control only while the server runs: an idle
// one, blocked in epoll_wait, would answer with the count of its last
// answer, so the server is sent PINGs (which count nothing) until the
// answer is in.
func callgrindCounter(b *testing.B, pid, addr string) func() float64 {
	return func() float64 {
		type answer struct {
			out []byte
			err error
		}
		ans := make(chan answer, 1)
		go func() {
			out, err := exec.Command("callgrind_control", "-e", pid).CombinedOutput()
			ans <- answer{out, err}
		}()
		var a answer
		for got := false; !got; {
			select {
			case a = <-ans:
				got = true
			case <-time.After(20 * time.Millisecond):
				_, _ = cli(addr, "ping")
			}
		}
		out, err := a.out, a.err
		if err != nil {
			b.Fatalf("callgrind_control: %v: %s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 3 && f[0] == "Th" && f[1] == "1" {
				x, err := strconv.ParseFloat(strings.ReplaceAll(f[2], ",", ""), 64)
				if err != nil {
					b.Fatalf("callgrind_control: %q: %v", line, err)
				}
				return x
			}
		}
		b.Fatalf("callgrind_control: no count for thread 1: %s", out)
		return 0
	}
}

// BenchmarkGroupInstructions counts the instructions Redis runs per group
// decision (Group.DecideGroup, the Envoy service's call), as
// BenchmarkScriptInstructions does for single limits (see it for the
// server to start), on the Envoy benchmark's shapes: one limit (a user)
// or three (a user, its address and one of four routes of a large
// limit); new keys, allowed decisions (L = 100000) and refused ones (L =
// 5, full keys).
func BenchmarkGroupInstructions(b *testing.B) {
	pid := os.Getenv("SLIDEGATE_CALLGRIND_PID")
	if pid == "" {
		b.Skip("SLIDEGATE_CALLGRIND_PID is not set: see BenchmarkScriptInstructions")
	}
	s, err := Open(standaloneURL(b), WithKeyPrefix(testPrefix(b)), WithTimeout(5*time.Second), WithRefusalCache(0))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	instructions := callgrindCounter(b, pid, standaloneAddr(b))
	group := func(name string, limit int) *Group {
		var ls []*Limiter
		for i, l := range []int{limit, limit, 500000} {
			lim, err := s.Limiter(engine.Policy{Name: name + strconv.Itoa(i), Limit: l, Window: time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			ls = append(ls, lim)
		}
		g, err := NewGroup(ls...)
		if err != nil {
			b.Fatal(err)
		}
		return g
	}
	// run decides users 0 to users-1, r times over, one descriptor or
	// three, from 16 callers, and returns the instructions per decision.
	run := func(g *Group, descs, users, r int) float64 {
		i0 := instructions()
		var next atomic.Int64
		var wg sync.WaitGroup
		total := int64(users * r)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				dst := make([]engine.Decision, 3)
				for i := next.Add(1) - 1; i < total; i = next.Add(1) - 1 {
					u := strconv.Itoa(int(i) % users)
					refs := []engine.Ref{{Policy: 0, Key: u}}
					if descs == 3 {
						refs = append(refs, engine.Ref{Policy: 1, Key: "10.0." + u}, engine.Ref{Policy: 2, Key: "/r" + strconv.Itoa(int(i)%4)})
					}
					if _, err := g.DecideGroup(context.Background(), dst, engine.GroupRequest{Refs: refs, N: 1}); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		return (instructions() - i0) / float64(total)
	}
	for _, descs := range []int{1, 3} {
		d := strconv.Itoa(descs)
		a := group("a"+d+"-", 100000)
		run(a, descs, 100, 2) // the library's first calls
		a = group("b"+d+"-", 100000)
		b.ReportMetric(run(a, descs, 2000, 1), d+"desc-new-instr/decision")
		b.ReportMetric(run(a, descs, 2000, 1), d+"desc-second-instr/decision")
		b.ReportMetric(run(a, descs, 100, 20), d+"desc-allowed-instr/decision")
		f := group("f"+d+"-", 5)
		run(f, descs, 100, 5) // fill
		b.ReportMetric(run(f, descs, 100, 10), d+"desc-refused-instr/decision")
	}
}

// BenchmarkScriptInstructions counts the instructions Redis runs inside
// the script call per decision, for the four common kinds of decision: a
// new client (a field in its bucket), its second request (the field
// moves to a ring of two), allowed (requests 2 to 21 of keys with L =
// 100) and refused (a full key, L = 10). It needs a standalone
// redis-server run under callgrind with collection only inside the call,
// and that process's id in SLIDEGATE_CALLGRIND_PID:
//
//	valgrind --tool=callgrind --toggle-collect=fcallCommand \
//	  --toggle-collect=evalShaCommand --toggle-collect=evalCommand \
//	  redis-server --port 26398 --save '' --appendonly no
//	SLIDEGATE_REDIS_ADDR=127.0.0.1:26398 SLIDEGATE_CALLGRIND_PID=<pid> \
//	  go test -run '^$' -bench ScriptInstructions -benchtime 1x ./redisstore/
//
// SLIDEGATE_REDIS_EVALSHA=1 counts the EVALSHA path. Instruction counts
// do not depend on the machine's load, unlike Redis CPU time.
func BenchmarkScriptInstructions(b *testing.B) {
	pid := os.Getenv("SLIDEGATE_CALLGRIND_PID")
	if pid == "" {
		b.Skip("SLIDEGATE_CALLGRIND_PID is not set: see the comment")
	}
	s, err := Open(standaloneURL(b), WithKeyPrefix(testPrefix(b)), WithTimeout(5*time.Second), WithRefusalCache(0))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	instructions := callgrindCounter(b, pid, standaloneAddr(b))
	const keys = 2000
	// run makes the decisions from 16 callers and returns the
	// instructions per decision.
	run := func(l *Limiter, calls []string) float64 {
		i0 := instructions()
		decideAll(b, l, calls, 16)
		return (instructions() - i0) / float64(len(calls))
	}
	limiter := func(name string, limit int) *Limiter {
		l, err := s.Limiter(engine.Policy{Name: name, Limit: limit, Window: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		return l
	}
	// calls lists keys 0 to n-1, each repeated r times in a row (inner) or
	// the whole list r times (outer).
	calls := func(n, r int, inner bool) []string {
		var cs []string
		for i := range n * r {
			k := i % n
			if inner {
				k = i / r
			}
			cs = append(cs, "k"+strconv.Itoa(k))
		}
		return cs
	}
	run(limiter("warm", 100), calls(100, 3, false)) // the library's first calls
	a := limiter("a", 100)
	b.ReportMetric(run(a, calls(keys, 1, false)), "new-instr/decision")
	b.ReportMetric(run(a, calls(keys, 1, false)), "second-instr/decision")
	b.ReportMetric(run(a, calls(keys/20, 20, false)), "allowed-instr/decision")
	f := limiter("f", 10)
	run(f, calls(keys/20, 10, true)) // fill
	b.ReportMetric(run(f, calls(keys/20, 10, false)), "refused-instr/decision")
}
