package redisstore

import (
	"context"
	"fmt"
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
		out, err := cli(a, "info", "cpu")
		if err != nil {
			tb.Fatalf("INFO cpu on %s: %v: %s", a, err, out)
		}
		for _, line := range strings.Split(out, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					tb.Fatalf("INFO cpu: %q: %v", line, err)
				}
				cpu += f * 1e6
			}
		}
	}
	return cpu
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
			ctx := context.Background()
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
				var next atomic.Int64
				var wg sync.WaitGroup
				c0 := serverCPU(b, dep.addrs)
				for range benchCallers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := next.Add(1) - 1; i < int64(len(calls)); i = next.Add(1) - 1 {
							if _, err := l.Decide(ctx, calls[i], 1); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
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
