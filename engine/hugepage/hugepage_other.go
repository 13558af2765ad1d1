//go:build !linux

package hugepage

// Advise does nothing off Linux (see the Linux build).
func Advise[T any]([]T) {}

// Release reports false off Linux: the caller drops the memory instead (see the Linux build).
func Release[T any]([]T) bool { return false }
