//go:build !linux

package kernels

// osYield is a no-op where sched_yield is not available; spinners still call runtime.Gosched.
func osYield() {}
