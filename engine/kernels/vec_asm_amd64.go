//go:build amd64 && !goexperiment.simd && !purego

package kernels

import (
	"math"
)

// vecISA is the instruction set of the vector kernels (softmax, attention, RMSNorm, SwiGLU).
type vecISA uint8

const (
	isaGeneric vecISA = iota
	isaAVX2
	isaAVX512
)

// vecActive is chosen once from the CPU's features (cpu_amd64.go).
var vecActive = selectVecISA()

// selectVecISA picks the widest set the CPU has. The AVX-512 kernels must also pass
// vecSelfCheck: the development machines and CI have no AVX-512 (the bit-identity tests run
// them wherever the CPU has it), so a start-up check that they reproduce the portable bits
// keeps a wrong result from ever reaching a model; on a mismatch the AVX2 kernels run.
func selectVecISA() vecISA {
	switch {
	case hasAVX512 && vecSelfCheck(isaAVX512):
		return isaAVX512
	case hasAVX2FMA:
		return isaAVX2
	}
	return isaGeneric
}

// vecSelfCheck reports whether every vector kernel on isa gives the portable kernels' bits on
// a fixed input of 77 elements (whole blocks and a tail) with NaN, ±Inf, -0 and far-below
// values, and on attention blocks of 1..9 rows at head width 48 (a partial group of four).
func vecSelfCheck(isa vecISA) bool {
	const n = 77
	var x, y, w [n]float32
	seed := uint32(12345)
	next := func() float32 { // a fixed LCG: the same input on every machine
		seed = seed*1664525 + 1013904223
		return float32(int32(seed>>8)-1<<23) / (1 << 21)
	}
	for i := range x {
		x[i], y[i], w[i] = next(), next(), next()
	}
	x[3], x[20], x[40], x[41], x[60] = float32(math.NaN()), float32(math.Inf(-1)), float32(math.Inf(1)), float32(math.Copysign(0, -1)), -200
	same32 := func(a, b []float32) bool {
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) && (a[i] == a[i] || b[i] == b[i]) {
				return false
			}
		}
		return true
	}
	var e1, e2 [n]float32
	ok := math.Float32bits(maxF32ISA(isa, x[:])) == math.Float32bits(maxF32Generic(x[:])) &&
		firstAtLeastISA(isa, x[:], 1) == firstAtLeastGeneric(x[:], 1) &&
		expShiftedISA(isa, e1[:], x[:], 2) == expShiftedGeneric(e2[:], x[:], 2) && same32(e1[:], e2[:]) &&
		sumSquaresISA(isa, y[:]) == sumSquaresGeneric(y[:])
	scaleMulISA(isa, e1[:], y[:], w[:], 0.7)
	scaleMulGeneric(e2[:], y[:], w[:], 0.7)
	ok = ok && same32(e1[:], e2[:])
	swigluISA(isa, e1[:], x[:], w[:])
	swigluGeneric(e2[:], x[:], w[:])
	ok = ok && same32(e1[:], e2[:])
	const hd = 48
	var k [hd + 8*(hd+3)]float32
	for i := range k {
		k[i] = next()
	}
	for rows := 1; ok && rows <= 9; rows++ {
		var s1, s2 [9]float32
		attnScoresISA(isa, s1[:], y[:hd], k[:], hd+3, 0, rows, 0.125)
		attnScoresGeneric(s2[:], y[:hd], k[:], hd+3, 0, rows, 0.125)
		o1, o2 := [hd]float32{}, [hd]float32{}
		attnAccumISA(isa, o1[:], w[:rows], k[:], hd+3, 0, rows)
		attnAccumGeneric(o2[:], w[:rows], k[:], hd+3, 0, rows)
		ok = same32(s1[:], s2[:]) && same32(o1[:], o2[:])
	}
	return ok
}

// The assembly kernels (vec_asm_amd64.s) work on whole blocks of 16 float32s, the canonical
// lane count, and leave tails and the final folds to the wrappers below, which follow the
// portable code's definition exactly. Every kernel ends with VZEROUPPER.

//go:noescape
func max512asm(p *float32, blocks int, out *[16]float32)

//go:noescape
func max256asm(p *float32, blocks int, out *[16]float32)

//go:noescape
func firstGE512asm(p *float32, blocks int, v float32) int

//go:noescape
func firstGE256asm(p *float32, blocks int, v float32) int

//go:noescape
func exp512asm(x, dst *float32, blocks int, shift float32, acc *[16]float64)

//go:noescape
func exp256asm(x, dst *float32, blocks int, shift float32, acc *[16]float64)

//go:noescape
func swiglu512asm(a, gate, up *float32, blocks int)

//go:noescape
func swiglu256asm(a, gate, up *float32, blocks int)

//go:noescape
func sumsq512asm(x *float32, blocks int, acc *[16]float64)

//go:noescape
func sumsq256asm(x *float32, blocks int, acc *[16]float64)

//go:noescape
func scale512asm(dst, x, w *float32, blocks int, s float32)

//go:noescape
func scale256asm(dst, x, w *float32, blocks int, s float32)

//go:noescape
func scores512asm(q, k *float32, rs, n, nch int, scale float32, out, tail *float32)

//go:noescape
func scores256asm(q, k *float32, rs, n, nch int, scale float32, out, tail *float32)

//go:noescape
func accum512asm(out, p, v *float32, rs, n, nch int)

//go:noescape
func accum256asm(out, p, v *float32, rs, n, nch int)

func clearUpperAsm()

func maxF32(x []float32) float32 { return maxF32ISA(vecActive, x) }

func expShifted(dst, x []float32, shift float32) float64 {
	return expShiftedISA(vecActive, dst, x, shift)
}

func firstAtLeast(x []float32, v float32) int { return firstAtLeastISA(vecActive, x, v) }

func attnScores(scores, q, k []float32, stride, off, n int, scale float32) {
	attnScoresISA(vecActive, scores, q, k, stride, off, n, scale)
}

func attnAccum(out, p, v []float32, stride, off, n int) {
	attnAccumISA(vecActive, out, p, v, stride, off, n)
}

func sumSquares(x []float32) float64 { return sumSquaresISA(vecActive, x) }

func scaleMul(dst, x, g []float32, s float32) { scaleMulISA(vecActive, dst, x, g, s) }

func swiglu(a, g, u []float32) { swigluISA(vecActive, a, g, u) }

// maxF32ISA is MaxF32 on isa: the blocks' lane maxima, then the tail, in portable code (max is
// exact, and maxF32Generic makes a zero +0).
func maxF32ISA(isa vecISA, x []float32) float32 {
	blocks := len(x) / 16
	if isa == isaGeneric || blocks == 0 {
		return maxF32Generic(x)
	}
	var out [16]float32
	if isa == isaAVX512 {
		max512asm(&x[0], blocks, &out)
	} else {
		max256asm(&x[0], blocks, &out)
	}
	return max(maxF32Generic(out[:]), maxF32Generic(x[blocks*16:]))
}

// firstAtLeastISA is FirstAtLeast on isa: the vector loop finds the first block with a hit (or
// none), the exact index is then found in portable code.
func firstAtLeastISA(isa vecISA, x []float32, v float32) int {
	blocks := len(x) / 16
	if isa == isaGeneric || blocks == 0 {
		return firstAtLeastGeneric(x, v)
	}
	var blk int
	if isa == isaAVX512 {
		blk = firstGE512asm(&x[0], blocks, v)
	} else {
		blk = firstGE256asm(&x[0], blocks, v)
	}
	lo := blk * 16 // the block with the hit, or the tail when there is none
	if i := firstAtLeastGeneric(x[lo:], v); i >= 0 {
		return lo + i
	}
	return -1
}

// expShiftedISA is ExpShifted (dst != nil) or SumExpShifted (dst == nil) on isa. A tail
// shorter than 16 is padded with -Inf (which contributes exactly 0) and goes through the same
// kernel, so every element gets the same exponential and partial sum wherever it sits.
func expShiftedISA(isa vecISA, dst, x []float32, shift float32) float64 {
	if isa == isaGeneric {
		return expShiftedGeneric(dst, x, shift)
	}
	run := func(src, d *float32, blocks int, acc *[16]float64) {
		if isa == isaAVX512 {
			exp512asm(src, d, blocks, shift, acc)
		} else {
			exp256asm(src, d, blocks, shift, acc)
		}
	}
	blocks := len(x) / 16
	var acc [16]float64
	if blocks > 0 {
		var dp *float32
		if dst != nil {
			dp = &dst[0]
		}
		run(&x[0], dp, blocks, &acc)
	}
	if rest := x[blocks*16:]; len(rest) > 0 {
		var buf [16]float32
		for i := range buf {
			buf[i] = float32(math.Inf(-1))
		}
		copy(buf[:], rest)
		if dst == nil {
			run(&buf[0], nil, 1, &acc)
		} else {
			run(&buf[0], &buf[0], 1, &acc)
			copy(dst[blocks*16:len(x)], buf[:len(rest)])
		}
	}
	return fold16(&acc)
}

// sumSquaresISA is RMSNorm's Σ x² on isa: whole blocks in assembly, the tail into the same
// partial sums in portable code.
func sumSquaresISA(isa vecISA, x []float32) float64 {
	blocks := len(x) / 16
	if isa == isaGeneric || blocks == 0 {
		return sumSquaresGeneric(x)
	}
	var acc [16]float64
	if isa == isaAVX512 {
		sumsq512asm(&x[0], blocks, &acc)
	} else {
		sumsq256asm(&x[0], blocks, &acc)
	}
	for j, v := range x[blocks*16:] {
		acc[j] += float64(v) * float64(v)
	}
	return fold16(&acc)
}

// scaleMulISA is RMSNorm's scaling on isa (elementwise: the tail in portable code).
func scaleMulISA(isa vecISA, dst, x, g []float32, s float32) {
	blocks := len(dst) / 16
	n := 0
	if isa != isaGeneric && blocks > 0 {
		n = blocks * 16
		x, g = x[:len(dst)], g[:len(dst)]
		if isa == isaAVX512 {
			scale512asm(&dst[0], &x[0], &g[0], blocks, s)
		} else {
			scale256asm(&dst[0], &x[0], &g[0], blocks, s)
		}
	}
	scaleMulGeneric(dst[n:], x[n:], g[n:], s)
}

// swigluISA is SwiGLU on isa (elementwise: the tail in portable code).
func swigluISA(isa vecISA, a, g, u []float32) {
	blocks := len(a) / 16
	n := 0
	if isa != isaGeneric && blocks > 0 {
		n = blocks * 16
		g, u = g[:len(a)], u[:len(a)]
		if isa == isaAVX512 {
			swiglu512asm(&a[0], &g[0], &u[0], blocks)
		} else {
			swiglu256asm(&a[0], &g[0], &u[0], blocks)
		}
	}
	swigluGeneric(a[n:], g[n:], u[n:])
}

// attnISA picks the widest kernel whose vector divides the head width hd.
func attnISA(isa vecISA, hd int) vecISA {
	switch {
	case isa == isaAVX512 && hd%16 == 0:
		return isaAVX512
	case isa >= isaAVX2 && hd%8 == 0:
		return isaAVX2
	}
	return isaGeneric
}

// attnScoresISA is AttnScores on isa (arguments checked). Scores are made four at a time; the
// last group of a block repeats its last row in the missing places and keeps only the real
// scores, so every score gets the same reduction wherever it sits.
func attnScoresISA(isa vecISA, scores, q, k []float32, stride, off, n int, scale float32) {
	hd := len(q)
	isa = attnISA(isa, hd)
	if isa == isaGeneric {
		attnScoresGeneric(scores, q, k, stride, off, n, scale)
		return
	}
	var tail [4]float32
	if isa == isaAVX512 {
		scores512asm(&q[0], &k[off], stride*4, n, hd/16, scale, &scores[0], &tail[0])
	} else {
		scores256asm(&q[0], &k[off], stride*4, n, hd/8, scale, &scores[0], &tail[0])
	}
	if full := n &^ 3; full < n {
		copy(scores[full:n], tail[:n-full])
	}
}

// attnAccumISA is AttnAccum on isa (arguments checked).
func attnAccumISA(isa vecISA, out, p, v []float32, stride, off, n int) {
	hd := len(out)
	isa = attnISA(isa, hd)
	if isa == isaGeneric {
		attnAccumGeneric(out, p, v, stride, off, n)
		return
	}
	if isa == isaAVX512 {
		accum512asm(&out[0], &p[0], &v[off], stride*4, n, hd/16)
	} else {
		accum256asm(&out[0], &p[0], &v[off], stride*4, n, hd/8)
	}
}
