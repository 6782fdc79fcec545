package rls

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// An idle watch tick opens no file: loadFunc looks at the files' stat
// first, reads them only when that changed, and parses them only when
// their contents changed.
func TestLoadFuncIdleReadsNothing(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"a", "b", "c"} {
		if err := os.WriteFile(filepath.Join(dir, n+".yaml"), []byte("domain: "+n+"\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	load := loadFunc(dir, LoadOptions{AllFiles: true})
	before := filesRead.Load()
	cfg, sig, err := load()
	if err != nil || len(cfg.Domains()) != 3 {
		t.Fatalf("first load: %v %v", cfg, err)
	}
	if n := filesRead.Load() - before; n != 3 {
		t.Fatalf("first load read %d files, want 3", n)
	}
	before = filesRead.Load()
	for range 100 {
		c2, s2, err := load()
		if err != nil || c2 != cfg || s2 != sig {
			t.Fatalf("an unchanged directory gave another configuration: %v", err)
		}
	}
	if n := filesRead.Load() - before; n != 0 {
		t.Fatalf("100 idle loads read %d files, want 0", n)
	}
	// The same contents written again: read, not parsed again.
	b := filepath.Join(dir, "b.yaml")
	data, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, data, 0o644); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Hour) // a new modification time, whatever the clock's grain
	if err := os.Chtimes(b, future, future); err != nil {
		t.Fatal(err)
	}
	if c2, s2, err := load(); err != nil || c2 != cfg || s2 != sig {
		t.Fatalf("rewritten with the same contents: %v", err)
	}
	// New contents: a new configuration.
	if err := os.WriteFile(b, []byte("domain: b2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c3, s3, err := load()
	if err != nil || c3 == cfg || s3 == sig || !contains(c3.Domains(), "b2") {
		t.Fatalf("changed contents not loaded: %v %v", c3, err)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
