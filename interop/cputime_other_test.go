//go:build !linux

package interop

import "time"

// threadCPU is not available here: see cputime_linux_test.go.
func threadCPU() (time.Duration, bool) { return 0, false }
