// Package kernels holds the engine's numeric kernels: a packed float32 matrix with a batched
// matrix multiply, softmax and attention pieces, the persistent worker pool that splits kernels
// across cores, and a streaming-read probe of the memory bandwidth that bounds decode.
//
// Batch invariance is the rule every kernel keeps: each output element is computed with one
// reduction order whatever the batch size, tile shape or split across workers. For MatMul that
// order is a sequential fused multiply-add chain over the input dimension, starting from zero:
//
//	acc = 0; for k := 0; k < cols; k++ { acc = fma(W[r][k], x[t][k], acc) }
//
// The SIMD kernels vectorise across output rows (one lane per row of a 16-row panel, x[t][k]
// broadcast), never across k, and the portable kernel's fma rounds once like the hardware's. So
// the AVX-512, AVX2 and pure-Go MatMul paths give bit-identical results, on every machine, for
// every batch size and pool size; tests check that bit for bit.
//
// The vector kernels (MaxF32, FirstAtLeast, SumExpShifted, ExpShifted, AttnScores, AttnAccum,
// RMSNorm, SwiGLU) have one canonical numeric definition too, which every path (portable Go,
// AVX-512, AVX2+FMA, NEON) computes bit for bit; tests compare each path with the portable one
// on every length 0..300, odd offsets and strides, and special values:
//
//   - fma(a, b, c) is a·b+c rounded once to float32 (fma32 in Go, VFMADD, FMLA); every other
//     float32 operation is one rounding, never fused.
//   - A 16-lane reduction gives element i to partial sum i mod 16 (in increasing i, from +0;
//     the tail is the same loop, i.e. zero-padding) and folds the partials in one tree: lane
//     j+8 into j, then j+4 into j, then (p0+p2)+(p1+p3). That is one AVX-512 vector folded in
//     halves, two AVX2 vectors (lanes 0-7, 8-15) added first, or four NEON vectors
//     ((v0+v2)+(v1+v3), ...).
//   - AttnScores: per row, the 16-lane reduction of fma(q[i], k[i], acc), then ·scale.
//   - AttnAccum: per output element, four fma chains over the slots (slot s into chain
//     s mod 4, in slot order, from +0), then out + ((a0+a1)+(a2+a3)); it vectorises over the
//     head, so lane width does not enter.
//   - Exponential (ExpShifted, SumExpShifted, SwiGLU): d = clamp(x − shift, −87, 0) in
//     float32; k = roundeven(d·log2 e); r = fma(k, −ln2hi, d), r = fma(k, −ln2lo, r); Cephes'
//     expf polynomial by Horner in fma from p0 down to p5; e = fma(p, r·r, r+1); e·2^k
//     (exact: k in [−126, 0] and the result is normal). NaN and −Inf elements give 0; +Inf
//     gives 1; a NaN shift is read as −Inf and +Inf as MaxFloat32. The sum of the float32
//     terms is the 16-lane reduction in float64.
//   - RMSNorm: Σ x² as the 16-lane reduction in float64 (each square exact), inv =
//     float32(1/sqrt(ss/n + eps)) in float64, then dst[i] = (x[i]·inv)·g[i].
//   - SwiGLU: e = exp(−|x|) as above, then x/(1+e)·u for x >= 0, else ((x·e)/(1+e))·u.
//   - MaxF32 and FirstAtLeast are exact; a zero maximum is +0 whichever zero a lane met
//     first. NaN results are NaN with an unspecified payload; everything else is exact bits.
//
// So a token's output depends neither on the batch nor on the machine or build it ran on.
//
// A Matrix may store its weights as bfloat16 or as int8 blocks with float32 scales (Precision,
// PackStackedAs). Its MatMul widens each stored weight to the float32 value it stands for (its
// effective weight) and runs the chain above on it, so it is the float32 MatMul of the
// effective weights, bit for bit, on every path. The amd64 builds read the formats in
// generated assembly tiles (kernels_low_*_amd64.s), arm64 in NEON tiles
// (kernels_neon_bf16_arm64.s, kernels_neon_i8_arm64.s); the others widen each panel into a
// float32 scratch panel for their float32 kernel (matmulWidened).
//
// The opt-in W8A8 precision stores int8's weights and also quantizes each MatMul's input per
// block of 32, so that a block is an exact integer dot product and one fma; it has its own
// definition (see W8A8), which the AVX2 tiles (w8a8_avx2_amd64.s, both amd64 builds, generated
// by gen_w8a8.go) and the portable Go kernel (every other build) keep bit for bit, so it is
// batch invariant too, but not the float32 MatMul of any weights.
//
// Four build modes pick the code: GOEXPERIMENT=simd on amd64 uses the simd/archsimd kernels
// (files tagged goexperiment.simd && amd64); the default amd64 build uses Go assembly
// (amd64 && !goexperiment.simd); arm64 uses NEON assembly for every kernel above (the MatMul
// tiles, attention at head widths of whole 16-element blocks, RMSNorm, the exponential, SwiGLU,
// MaxF32, FirstAtLeast) and for the streaming-read probe; purego or any other GOARCH uses the
// portable kernels, which are much slower. The amd64 paths are chosen at run time from the
// CPU's features (see KernelName). The default build's AVX-512 vector kernels also have to
// reproduce the portable bits in a start-up self-check, else the AVX2 ones run: CI machines
// may lack AVX-512, and a wrong kernel must never reach a model. Build and test every mode.
//
// A batched MatMul walks each token block (64 tokens) panel group by panel group: every token
// tile re-reads the group's panels from L2, so only the first tile over a group would wait on
// memory. The default build's main tile (4 panels × 6 tokens on AVX-512, 1 × 6 on AVX2) has a
// variant that also prefetches one line of the next group per step, issued by the group's first
// tiles, so the next group is in cache when it starts; the weights, the KV pool and the
// read probe ask Linux for transparent huge pages (MADV_HUGEPAGE), so streaming them does not
// walk the page tables at every 4 KB. Attention reads K/V as head-wide strips of rows a few KB
// apart, which the hardware prefetchers do not follow, so its caller hints each next call's
// rows with PrefetchRows (PREFETCHT0 or PRFM; a no-op in the portable build).
//
// The assembly tiles (kernels_asm_*_amd64.s), the archsimd tiles in kernels_*_amd64.go and the
// archsimd build's AVX2 assembly tiles in kernels_avx2_amd64.s are generated by gen_kernels.go;
// the NEON tiles (kernels_neon_arm64.s) and the NEON exponential, SwiGLU, MaxF32, FirstAtLeast
// and read-probe kernels (vec_neon_arm64.s) by gen_neon.go (go generate). The Go assembler
// lacks most floating-point vector instructions on arm64, so those are WORD encodings with the
// instruction beside each; TestNEONWordEncodings checks every one against binutils' assembler.
package kernels

//go:generate go run gen_kernels.go
