//go:build !(goexperiment.simd && amd64)

package main

const simdExperiment = false

// simdState explains why no vector path is compiled in.
func simdState() string {
	return "off (pure-Go kernels; build with GOEXPERIMENT=simd on amd64 for SIMD)"
}
