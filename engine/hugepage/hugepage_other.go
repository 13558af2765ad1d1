//go:build !linux

package hugepage

// Advise does nothing off Linux (see the Linux build).
func Advise[T any]([]T) {}
