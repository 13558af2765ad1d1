//go:build amd64 && !goexperiment.simd && !purego

package kernels

// vecImpls is the portable kernels alone: this build has no SIMD.
func vecImpls() []vecImpl { return []vecImpl{genericVecImpl()} }
