//go:build amd64 && !goexperiment.simd && !purego

package kernels

// simdImpls is empty: this build has only the portable kernel.
func simdImpls() []impl { return nil }
