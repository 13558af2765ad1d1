//go:build amd64 && !purego

package kernels

// prefetchBatch1 is whether this CPU's AVX-512 batch-1 tiles prefetch ahead of their
// panels: the float32, bf16 and int8 4×1 tiles (2 KB ahead) and the VNNI w8a8 two-panel tiles
// of 1 to 4 tokens (two blocks ahead). Each is generated with and without the prefetch.
var prefetchBatch1 = batch1Prefetches(cpuVendorFamily())

// batch1Prefetches reports whether the AVX-512 batch-1 tiles should prefetch on a CPU of this
// vendor and family. On AVX-512 Xeons software prefetch made them stream 5-20% more weights.
// On a Zen 5 EPYC (family 0x1a) the prefetching forms streamed more in most paired rounds
// (BenchmarkW8A8Kernels' vnni-prefetch against vnni-plain, BenchmarkBatch1Prefetch). On a Zen 4
// EPYC (family 0x19) it cost: the VNNI tile streamed a fifth to a third less and w8a8 decoded
// 10-25% slower; the float32 tile 5-15% less (BenchmarkMatMulPrecision, two builds
// alternating), bf16 mostly less.
func batch1Prefetches(amd bool, family uint32) bool {
	return !amd || family != 0x19
}

// batch1Table is tiles with its 4×1 (batch-1) tile replaced by plain, the same tile without
// its prefetch, where this CPU does not prefetch.
func batch1Table(tiles *[maxTileP + 1][maxTileT + 1]tileFunc, plain tileFunc, prefetch bool) *[maxTileP + 1][maxTileT + 1]tileFunc {
	if prefetch {
		return tiles
	}
	t := *tiles
	t[4][1] = plain
	return &t
}

// cpuVendorFamily reads the CPU's vendor (AMD or not) and its display family (CPUID leaf 1:
// the base family, plus the extended family when the base is 0xf).
func cpuVendorFamily() (amd bool, family uint32) {
	_, b, c, d := cpuid(0, 0)
	amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163 // "AuthenticAMD"
	a, _, _, _ := cpuid(1, 0)
	family = a >> 8 & 0xf
	if family == 0xf {
		family += a >> 20 & 0xff
	}
	return amd, family
}

// cpuid executes CPUID for leaf and subleaf sub (cpuid_amd64.s).
//
//go:noescape
func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)
