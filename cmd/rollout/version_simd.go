//go:build goexperiment.simd && amd64

package main

import (
	"strings"

	"simd/archsimd"
)

const simdExperiment = true

// simdState lists the vector extensions archsimd reports on this CPU.
func simdState() string {
	var feats []string
	for _, f := range []struct {
		name string
		ok   bool
	}{
		{"avx", archsimd.X86.AVX()},
		{"avx2", archsimd.X86.AVX2()},
		{"fma", archsimd.X86.FMA()},
		{"avx512", archsimd.X86.AVX512()},
	} {
		if f.ok {
			feats = append(feats, f.name)
		}
	}
	if len(feats) == 0 {
		return "on (no AVX on this CPU: portable kernels)"
	}
	return "on (" + strings.Join(feats, ",") + ")"
}
