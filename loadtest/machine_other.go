//go:build !linux

package loadtest

// machineBusySeconds is not measured on this system.
func machineBusySeconds() (float64, bool) { return 0, false }
