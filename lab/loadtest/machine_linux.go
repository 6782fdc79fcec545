package loadtest

import (
	"bytes"
	"os"
	"strconv"
)

// machineBusySeconds returns the CPU time every process on the machine
// has used since boot (user, nice, system and steal, summed over CPUs,
// from /proc/stat), and ok = false when it cannot be read. Interrupt and
// softirq time are left out: the kernel does not charge them to the
// process they serve, and under a load test on loopback they are mostly
// the harness's own packets (0.1 to 0.2 core at 30,000 requests/s here).
// Its resolution is the kernel's clock tick (USER_HZ, 100 per second on
// Linux).
func machineBusySeconds() (float64, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	// cpu user nice system idle iowait irq softirq steal guest guest_nice
	if len(f) < 9 || string(f[0]) != "cpu" {
		return 0, false
	}
	var ticks float64
	for _, i := range []int{1, 2, 3, 8} {
		v, err := strconv.ParseUint(string(f[i]), 10, 64)
		if err != nil {
			return 0, false
		}
		ticks += float64(v)
	}
	const userHZ = 100
	return ticks / userHZ, true
}

// cpuModel is the first "model name" of /proc/cpuinfo, "" when there is
// none.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for line := range bytes.Lines(b) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if ok && string(bytes.TrimSpace(k)) == "model name" {
			return string(bytes.TrimSpace(v))
		}
	}
	return ""
}
