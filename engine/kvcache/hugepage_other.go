//go:build !linux

package kvcache

// adviseHugePages does nothing off Linux (see the Linux build).
func adviseHugePages[T any]([]T) {}
