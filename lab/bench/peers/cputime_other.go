//go:build !unix

package peers

import "time"

// processCPU returns 0: this system's process CPU time is not read here.
func processCPU() time.Duration { return 0 }
