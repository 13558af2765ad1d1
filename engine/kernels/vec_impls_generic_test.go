//go:build purego || !(amd64 || arm64)

package kernels

// vecImpls is the portable kernels alone: this build has no SIMD.
func vecImpls() []vecImpl { return []vecImpl{genericVecImpl()} }
