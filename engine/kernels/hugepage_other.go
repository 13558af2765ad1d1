//go:build !linux

package kernels

// adviseHugePages does nothing off Linux (see the Linux build).
func adviseHugePages[T any]([]T) {}
