//go:build !linux

package loadtest

// machineBusySeconds is not measured on this system.
func machineBusySeconds() (float64, bool) { return 0, false }

// cpuModel is not read on this system.
func cpuModel() string { return "" }
