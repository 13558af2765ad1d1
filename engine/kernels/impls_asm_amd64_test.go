//go:build amd64 && !goexperiment.simd && !purego

package kernels

// simdImpls lists the assembly kernels this CPU can run, so tests cover AVX2 on AVX-512
// machines too.
func simdImpls() []impl {
	var out []impl
	if hasAVX512 {
		out = append(out, impl{"avx512", func(m *Matrix, y, x []float32, n, lo, hi int) { matmulSIMD(&avx512Kernel, m, y, x, n, lo, hi) }})
	}
	if hasAVX2FMA {
		out = append(out, impl{"avx2", func(m *Matrix, y, x []float32, n, lo, hi int) { matmulSIMD(&avx2Kernel, m, y, x, n, lo, hi) }})
	}
	return out
}

// tileKernels lists the tile tables this CPU can run.
func tileKernels() []*simdKernel {
	var out []*simdKernel
	if hasAVX512 {
		out = append(out, &avx512Kernel)
	}
	if hasAVX2FMA {
		out = append(out, &avx2Kernel)
	}
	return out
}

// lowSIMDImpls lists the kernels reading bf16 or int8 directly that this CPU can run.
func lowSIMDImpls() []impl {
	var out []impl
	add := func(name string, bf, i8 *simdKernel) {
		out = append(out, impl{name, func(m *Matrix, y, x []float32, n, lo, hi int) {
			k := bf
			if m.Prec == Int8 {
				k = i8
			}
			matmulSIMD(k, m, y, x, n, lo, hi)
		}})
	}
	if hasAVX512 {
		add("avx512", &avx512BF16Kernel, &avx512Int8Kernel)
	}
	if hasAVX2FMA {
		add("avx2", &avx2BF16Kernel, &avx2Int8Kernel)
	}
	return out
}
