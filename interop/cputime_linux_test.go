package interop

import (
	"syscall"
	"time"
)

// threadCPU returns the CPU time the calling thread has used, and true. On
// a machine shared with other work it measures a benchmark's own cost where
// wall time also counts the waits for a core.
func threadCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if syscall.Getrusage(1, &ru) != nil { // RUSAGE_THREAD
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
