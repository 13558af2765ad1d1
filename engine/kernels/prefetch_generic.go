//go:build purego || !(amd64 || arm64)

package kernels

// prefetchRows is a no-op in the portable build: Go has no prefetch hint.
func prefetchRows(*float32, int, int, int) {}
