package rls_test

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/internal/rls"
)

// rulesYAML is one domain of n descriptors, each with its own limit.
func rulesYAML(n int) string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {unit: minute, requests_per_unit: 100}\n", i)
	}
	return b.String()
}

// A rule on the memory store costs tens of kilobytes and no goroutine of
// its own before any traffic: 2,000 rules held about 420 MB and 2,000
// goroutines when each rule's limiter had 64 shards and a sweeper.
func TestMemoryRulesAreCheap(t *testing.T) {
	const rules = 2000
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), rulesYAML(rules))
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	mb := rls.NewMemoryBackends()
	defer mb.Close()
	r, err := rls.NewReloader(dir, rls.LoadOptions{AllFiles: true}, mb.Factory, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	runtime.GC()
	runtime.ReadMemStats(&after)
	perRule := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / rules
	goroutines := runtime.NumGoroutine() - g0
	t.Logf("%d rules: %d heap bytes and %d goroutines per rule", rules, perRule, goroutines/rules)
	if perRule > 64<<10 {
		t.Errorf("%d heap bytes per rule, want at most 64 KiB", perRule)
	}
	if goroutines > 1 {
		t.Errorf("%d goroutines for %d rules, want at most 1", goroutines, rules)
	}
}

// A configuration of more than MaxLimitedRules rules with a rate limit is
// refused.
func TestMaxLimitedRules(t *testing.T) {
	if _, err := rls.ParseConfig("a.yaml", []byte(rulesYAML(rls.MaxLimitedRules))); err != nil {
		t.Fatalf("%d rules: %v", rls.MaxLimitedRules, err)
	}
	_, err := rls.ParseConfig("a.yaml", []byte(rulesYAML(rls.MaxLimitedRules+1)))
	if err == nil || !strings.Contains(err.Error(), "with a rate limit") {
		t.Fatalf("%d rules: %v", rls.MaxLimitedRules+1, err)
	}
}
