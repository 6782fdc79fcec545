package leakcheck

import (
	"strings"
	"testing"
)

func TestFindsALeak(t *testing.T) {
	stop := make(chan struct{})
	go func() { <-stop }()
	err := findWithin(0)
	close(stop)
	if err == nil || !strings.Contains(err.Error(), "1 goroutines left running") {
		t.Fatalf("Find = %v, want one leaked goroutine", err)
	}
	if err := Find(); err != nil {
		t.Fatalf("after the goroutine returned: %v", err)
	}
}

func TestIgnoreCurrent(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	go func() { <-stop }()
	if err := findWithin(0, IgnoreCurrent()); err == nil {
		return // the goroutine had not started when IgnoreCurrent looked
	}
	opt := IgnoreCurrent()
	if err := findWithin(0, opt); err != nil {
		t.Fatalf("IgnoreCurrent still reports: %v", err)
	}
}
