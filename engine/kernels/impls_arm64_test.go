//go:build arm64 && !purego

package kernels

// simdImpls is empty: this build has only the portable kernel.
func simdImpls() []impl { return nil }
