package rls_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/slidegate/slidegate/internal/rls"
)

// loadWithin runs LoadDir, failing the test if it has not returned within
// a minute (a hang bound, not a timing assertion).
func loadWithin(t *testing.T, dir string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := rls.LoadDir(dir, rls.LoadOptions{AllFiles: true})
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("LoadDir(%s) did not return within a minute", dir)
		return nil
	}
}

// aliasBomb is a configuration of nested YAML aliases: each level is ten
// descriptors holding the level below, so the file stands for 10^levels
// descriptors.
func aliasBomb(levels int) string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: l0\n    descriptors: &a0 [")
	for i := range 10 {
		fmt.Fprintf(&b, "{key: k%d}, ", i)
	}
	b.WriteString("]\n")
	for l := 1; l <= levels; l++ {
		fmt.Fprintf(&b, "  - key: l%d\n    descriptors: &a%d [", l, l)
		for i := range 10 {
			fmt.Fprintf(&b, "{key: k%d, descriptors: *a%d}, ", i, l-1)
		}
		b.WriteString("]\n")
	}
	return b.String()
}

// A file of nested aliases is refused at once, not expanded.
func TestLoadDirAliasBomb(t *testing.T) {
	dir := t.TempDir()
	bomb := aliasBomb(9)
	if len(bomb) > 4096 {
		t.Fatalf("the bomb is %d bytes", len(bomb))
	}
	write(t, filepath.Join(dir, "bomb.yaml"), bomb)
	if err := loadWithin(t, dir); err == nil || !strings.Contains(err.Error(), "aliases expand") {
		t.Fatalf("got %v", err)
	}
	// A few aliases within the bound are read as YAML defines them.
	ok := t.TempDir()
	write(t, filepath.Join(ok, "a.yaml"), "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &r {unit: minute, requests_per_unit: 3}\n  - key: b\n    rate_limit: *r\n")
	if err := loadWithin(t, ok); err != nil {
		t.Fatal(err)
	}
}

// Only regular files are read: a FIFO, a device and symlinks to them are
// refused with an error naming them, without opening them.
func TestLoadDirRefusesSpecialFiles(t *testing.T) {
	for name, setup := range map[string]func(t *testing.T, dir string){
		"fifo": func(t *testing.T, dir string) {
			if err := syscall.Mkfifo(filepath.Join(dir, "a.yaml"), 0o644); err != nil {
				t.Skip("no FIFO:", err)
			}
		},
		"symlink to a fifo": func(t *testing.T, dir string) {
			fifo := filepath.Join(t.TempDir(), "fifo")
			if err := syscall.Mkfifo(fifo, 0o644); err != nil {
				t.Skip("no FIFO:", err)
			}
			if err := os.Symlink(fifo, filepath.Join(dir, "a.yaml")); err != nil {
				t.Fatal(err)
			}
		},
		"symlink to /dev/zero": func(t *testing.T, dir string) {
			if _, err := os.Stat("/dev/zero"); err != nil {
				t.Skip("no /dev/zero")
			}
			if err := os.Symlink("/dev/zero", filepath.Join(dir, "a.yaml")); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			setup(t, dir)
			if err := loadWithin(t, dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
				t.Fatalf("got %v", err)
			}
		})
	}
}

// A file over MaxConfigBytes, or files over MaxConfigTotalBytes
// together, are refused from their sizes, before they are read (the files
// here are sparse: no disk is written).
func TestLoadDirSizeBounds(t *testing.T) {
	big := t.TempDir()
	if err := os.WriteFile(filepath.Join(big, "a.yaml"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(big, "a.yaml"), rls.MaxConfigBytes+1); err != nil {
		t.Fatal(err)
	}
	if err := loadWithin(t, big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("one big file: %v", err)
	}
	many := t.TempDir()
	for i := range rls.MaxConfigTotalBytes/rls.MaxConfigBytes + 1 {
		f := filepath.Join(many, fmt.Sprintf("%d.yaml", i))
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(f, rls.MaxConfigBytes); err != nil {
			t.Fatal(err)
		}
	}
	if err := loadWithin(t, many); err == nil || !strings.Contains(err.Error(), "together") {
		t.Fatalf("many files: %v", err)
	}
}

// The real watcher: a FIFO dropped into the directory is refused (the
// rules in force stay), a later change is still applied, and the watch
// stops when asked. An empty directory is a configuration without
// domains, and a directory emptied later unloads the rules.
func TestWatchSpecialFileAndEmptyDirectory(t *testing.T) {
	dir := t.TempDir()
	mb := rls.NewMemoryBackends()
	defer mb.Close()
	r, err := rls.NewReloader(dir, rls.LoadOptions{AllFiles: true}, mb.Factory, nil, nil)
	if err != nil {
		t.Fatalf("an empty directory: %v", err)
	}
	defer r.Close()
	ask := func() *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := r.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := ask(); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("no rules: %v", resp)
	}
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() { r.Watch(ctx, 10*time.Millisecond); close(watched) }()
	until := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within a minute", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	write(t, filepath.Join(dir, "a.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	until("a.yaml in force", func() bool { return ask().Statuses[0].CurrentLimit.GetRequestsPerUnit() == 1 })
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644); err != nil {
		t.Skip("no FIFO:", err)
	}
	time.Sleep(100 * time.Millisecond) // ticks that meet the FIFO
	if got := ask().Statuses[0].CurrentLimit.GetRequestsPerUnit(); got != 1 {
		t.Fatalf("the rules in force changed to %d", got)
	}
	if err := os.Remove(filepath.Join(dir, "fifo.yaml")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "a.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 7}\n")
	until("a change after the FIFO", func() bool { return ask().Statuses[0].CurrentLimit.GetRequestsPerUnit() == 7 })
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	until("the rules unloaded", func() bool { return ask().Statuses[0].CurrentLimit == nil })
	cancel()
	select {
	case <-watched:
	case <-time.After(time.Minute):
		t.Fatal("Watch did not stop within a minute")
	}
}
