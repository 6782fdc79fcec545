package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// cmdCalls returns how many times the server at addr ran cmd (INFO
// commandstats), 0 if never.
func cmdCalls(t testing.TB, addr, cmd string) int64 {
	t.Helper()
	out, err := cli(addr, "info", "commandstats")
	if err != nil {
		t.Fatalf("INFO commandstats on %s: %v: %s", addr, err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls=")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		if err != nil {
			t.Fatalf("INFO commandstats: %q: %v", line, err)
		}
		return n
	}
	return 0
}

// scriptOn reports whether the server at addr has what l's store calls
// (the library under FCALL, the log script under EVALSHA), and names it.
func scriptOn(t testing.TB, l *Limiter, addr string) (string, bool) {
	t.Helper()
	if l.st.conn.(functionConn).functions() {
		name, _ := library()
		out, err := cli(addr, "function", "list", "libraryname", name)
		return "library " + name, err == nil && strings.Contains(out, name)
	}
	out, err := cli(addr, "script", "exists", logScript.sha)
	return "script", err == nil && strings.TrimSpace(out) == "1"
}

// decideExact decides k+2 requests of one key under a limit of k (one
// window), and fails unless exactly the first k are allowed.
func decideExact(t *testing.T, l *Limiter, key string) {
	t.Helper()
	k := l.policy.Limit
	for i := range k + 2 {
		d, err := l.Decide(context.Background(), key, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Fallback || d.Allowed != (i < k) {
			t.Fatalf("request %d of %q: allowed %v (fallback %v), want %v", i+1, key, d.Allowed, d.Fallback, i < k)
		}
	}
}

// TestFunctionsDecide: on Redis 7, decisions run as FCALLs of the loaded
// library (no EVALSHA), on one server and on every master of a Cluster,
// and decide exactly; the counter and the group go the same way.
func TestFunctionsDecide(t *testing.T) {
	if functionsOff {
		t.Skip("SLIDEGATE_REDIS_EVALSHA: the EVALSHA path")
	}
	for _, dep := range []struct {
		name  string
		url   string
		addrs []string
	}{
		{"standalone", standaloneURL(t), []string{standaloneAddr(t)}},
		{"cluster", clusterURL(t), clusterAddrs(t)},
	} {
		t.Run(dep.name, func(t *testing.T) {
			p := engine.Policy{Name: "fn", Limit: 3, Window: time.Minute}
			// Without the refusal cache every decision is a call.
			l := newTestLimiter(t, dep.url, p, WithRefusalCache(0))
			if !l.st.conn.(functionConn).functions() {
				t.Fatal("the store runs EVALSHA on Redis 7")
			}
			name, _ := library()
			for _, a := range dep.addrs {
				if out, err := cli(a, "function", "list", "libraryname", name); err != nil || !strings.Contains(out, name) {
					t.Fatalf("FUNCTION LIST on %s: %v: %q lacks %s", a, err, out, name)
				}
			}
			c, err := l.st.Limiter(engine.Policy{Name: "fnc", Limit: 3, Window: time.Minute, Algorithm: engine.SlidingCounter})
			if err != nil {
				t.Fatal(err)
			}
			// The servers' command counts are shared with the tests of
			// other packages (a go-redis store runs EVALSHA), so a pass
			// that saw another's EVAL/EVALSHA is run again on new keys;
			// this store's own EVALSHA would show in every pass.
			var evals []int64
			for pass := range 5 {
				var fc0, es0 int64
				for _, a := range dep.addrs {
					fc0 += cmdCalls(t, a, "fcall")
					es0 += cmdCalls(t, a, "evalsha") + cmdCalls(t, a, "eval")
				}
				const keys = 30
				for i := range keys {
					decideExact(t, l, fmt.Sprintf("c%d-%d", pass, i))
				}
				decideExact(t, c, fmt.Sprintf("counter-%d", pass))
				var fc, es int64
				for _, a := range dep.addrs {
					fc += cmdCalls(t, a, "fcall")
					es += cmdCalls(t, a, "evalsha") + cmdCalls(t, a, "eval")
				}
				// The FCALLs are at least this pass's decisions.
				if want := int64(keys*(p.Limit+2) + p.Limit + 2); fc-fc0 < want {
					t.Fatalf("%d FCALLs for %d decisions", fc-fc0, want)
				}
				if es == es0 {
					return
				}
				evals = append(evals, es-es0)
			}
			t.Fatalf("EVAL/EVALSHA calls besides the FCALLs in every pass: %v", evals)
		})
	}
}

// waitFunctions waits (a hang bound) until the store runs FCALL again.
func waitFunctions(t *testing.T, l *Limiter, addr string) {
	t.Helper()
	name, _ := library()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, _ := cli(addr, "function", "list", "libraryname", name)
		if strings.Contains(out, name) && l.st.conn.(functionConn).functions() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the library was not loaded again: %q", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFunctionsFlushed: a server that forgets the library (FUNCTION
// FLUSH, as after a restart without persistence) still decides every
// request exactly, by EVALSHA, and the store loads the library again.
func TestFunctionsFlushed(t *testing.T) {
	if functionsOff {
		t.Skip("SLIDEGATE_REDIS_EVALSHA: the EVALSHA path")
	}
	p := ownRedis(t)
	l := newTestLimiter(t, "redis://"+p.addr, engine.Policy{Name: "flush", Limit: 4, Window: time.Minute}, WithRefusalCache(0))
	decideExact(t, l, "before")
	if out, err := p.cli("function", "flush", "sync"); err != nil {
		t.Fatalf("FUNCTION FLUSH: %v: %s", err, out)
	}
	es0 := cmdCalls(t, p.addr, "evalsha") + cmdCalls(t, p.addr, "eval")
	decideExact(t, l, "after")
	if es := cmdCalls(t, p.addr, "evalsha") + cmdCalls(t, p.addr, "eval"); es == es0 {
		t.Fatal("no EVALSHA after the library was flushed")
	}
	waitFunctions(t, l, p.addr)
	fc0 := cmdCalls(t, p.addr, "fcall")
	decideExact(t, l, "reloaded")
	if fc := cmdCalls(t, p.addr, "fcall"); fc-fc0 != int64(l.policy.Limit+2) {
		t.Fatalf("%d FCALLs for %d decisions after the reload", fc-fc0, l.policy.Limit+2)
	}
}

// TestFunctionsRefused: a user whose ACL forbids FUNCTION and FCALL gets
// the EVALSHA path, which decides exactly.
func TestFunctionsRefused(t *testing.T) {
	p := ownRedis(t)
	if out, err := p.cli("acl", "setuser", "nofn", "on", ">pw", "~*", "+@all", "-@scripting", "+eval", "+evalsha"); err != nil || !strings.Contains(out, "OK") {
		t.Fatalf("ACL SETUSER: %v: %s", err, out)
	}
	l := newTestLimiter(t, "redis://nofn:pw@"+p.addr, engine.Policy{Name: "acl", Limit: 4, Window: time.Minute}, WithRefusalCache(0))
	if l.st.conn.(functionConn).functions() {
		t.Fatal("FCALL chosen although FUNCTION is refused")
	}
	decideExact(t, l, "k")
	if es := cmdCalls(t, p.addr, "evalsha") + cmdCalls(t, p.addr, "eval"); es < int64(l.policy.Limit+2) {
		t.Fatalf("%d EVAL/EVALSHA calls for %d decisions", es, l.policy.Limit+2)
	}
	if fc := cmdCalls(t, p.addr, "fcall"); fc != 0 {
		t.Fatalf("%d FCALLs", fc)
	}
}

// TestFCallDenied: a user allowed FUNCTION LOAD but not FCALL gets exact
// decisions by EVALSHA from the first FCALL refused on, and the store
// keeps EVALSHA (the health check does not turn it back to FCALL).
func TestFCallDenied(t *testing.T) {
	if functionsOff {
		t.Skip("SLIDEGATE_REDIS_EVALSHA: the EVALSHA path")
	}
	p := ownRedis(t)
	if out, err := p.cli("acl", "setuser", "nofcall", "on", ">pw", "~*", "+@all", "-fcall"); err != nil || !strings.Contains(out, "OK") {
		t.Fatalf("ACL SETUSER: %v: %s", err, out)
	}
	l := newTestLimiter(t, "redis://nofcall:pw@"+p.addr, engine.Policy{Name: "nofcall", Limit: 4, Window: time.Minute},
		WithRefusalCache(0), WithHealthInterval(20*time.Millisecond))
	if !l.st.conn.(functionConn).functions() {
		t.Fatal("FUNCTION LOAD was allowed: the store should try FCALL")
	}
	decideExact(t, l, "k")
	time.Sleep(200 * time.Millisecond) // health checks
	if l.st.conn.(functionConn).functions() {
		t.Fatal("the store turned back to FCALL, which the server refuses")
	}
	decideExact(t, l, "k2")
	if es := cmdCalls(t, p.addr, "evalsha") + cmdCalls(t, p.addr, "eval"); es < int64(2*(l.policy.Limit+2)) {
		t.Fatalf("%d EVAL/EVALSHA calls for %d decisions", es, 2*(l.policy.Limit+2))
	}
}

// The scripts EVALSHA runs bind none of the locals a function library
// keeps from call to call (evalText): under EVALSHA each call would make
// them again. The library binds them in every function, and its prelude
// holds the line it replaces.
func TestEvalTextPlain(t *testing.T) {
	for i, s := range allScripts {
		for _, w := range []string{"RC(", "SP(", "SU(", "SS(", "SF(", "MF(", "NUM[", "num(", "local OFA", preludeRC} {
			if strings.Contains(s.body, w) {
				t.Errorf("script %d: its EVALSHA text holds %q", i, w)
			}
		}
	}
	if !strings.Contains(luaPrelude, preludeRC) {
		t.Fatal("luaPrelude does not hold preludeRC: the library would bind nothing")
	}
	_, text := library()
	if strings.Contains(text, preludeRC) || strings.Count(text, bindRC) != len(allScripts) {
		t.Errorf("the library binds its locals in %d of %d functions", strings.Count(text, bindRC), len(allScripts))
	}
}
