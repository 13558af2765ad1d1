//go:build purego || !(amd64 || arm64)

package kernels

// simdImpls is empty: this build has only the portable kernel.
func simdImpls() []impl { return nil }
