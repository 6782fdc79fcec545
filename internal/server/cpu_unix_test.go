//go:build unix

package server_test

import "syscall"

// processCPU is the CPU time the process has used (user + system), in
// seconds: benchmarks report it per operation, which a loaded machine
// does not inflate as it does wall time.
func processCPU() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
