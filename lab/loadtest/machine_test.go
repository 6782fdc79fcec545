package loadtest

import (
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestMachineBusySeconds: on Linux the machine's CPU time is read and
// grows at least by what this process burns.
func TestMachineBusySeconds(t *testing.T) {
	a, ok := machineBusySeconds()
	if runtime.GOOS != "linux" {
		if ok {
			t.Fatal("read outside Linux")
		}
		return
	}
	if !ok || a <= 0 {
		t.Fatalf("machineBusySeconds() = %v, %v", a, ok)
	}
	c0 := cpuSeconds()
	for deadline := time.Now().Add(200 * time.Millisecond); time.Now().Before(deadline); {
	}
	burnt := cpuSeconds() - c0
	b, _ := machineBusySeconds()
	// Two clock ticks of slack: both counters advance by ticks.
	if b-a < burnt-0.02 {
		t.Errorf("machine busy %.2f s while this process alone burnt %.2f s", b-a, burnt)
	}
}

// TestCPUModel: on Linux the CPU model is read from /proc/cpuinfo where
// it has one.
func TestCPUModel(t *testing.T) {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil || !strings.Contains(string(b), "model name") {
		t.Skip("no model name in /proc/cpuinfo")
	}
	if m := cpuModel(); m == "" || !strings.Contains(string(b), m) {
		t.Errorf("cpuModel() = %q", m)
	}
}
