//go:build !linux

package api

// lowPriority is a no-op where a single thread's priority cannot be lowered portably.
func lowPriority() {}
