//go:build goexperiment.simd && amd64 && !purego

package kernels

import (
	"math"
	"simd/archsimd"
	"unsafe"
)

// vecISA is the instruction set of the vector (softmax and attention) kernels.
type vecISA uint8

const (
	isaGeneric vecISA = iota
	isaAVX2
	isaAVX512
)

// vecActive is chosen once from the CPU's features.
var vecActive = selectVecISA()

func selectVecISA() vecISA {
	switch {
	case archsimd.X86.AVX512():
		return isaAVX512
	case archsimd.X86.AVX2() && archsimd.X86.FMA():
		return isaAVX2
	}
	return isaGeneric
}

func maxF32(x []float32) float32 { return maxF32ISA(vecActive, x) }

func expShifted(dst, x []float32, shift float32) float64 {
	return expShiftedISA(vecActive, dst, x, shift)
}

// maxF32ISA is MaxF32 on isa. The tail past the last whole vector is done in scalar code after
// the vector loop has cleared the AVX state; max is exact, so this changes no bits.
func maxF32ISA(isa vecISA, x []float32) float32 {
	var lanes int
	switch isa {
	case isaAVX512:
		lanes = 16
	case isaAVX2:
		lanes = 8
	default:
		return maxF32Generic(x)
	}
	blocks := len(x) / lanes
	if blocks == 0 {
		return maxF32Generic(x)
	}
	var out [16]float32
	p := unsafe.Pointer(unsafe.SliceData(x))
	if isa == isaAVX512 {
		max512(p, blocks, &out)
	} else {
		max256(p, blocks, (*[8]float32)(out[:8]))
	}
	return max(maxF32Generic(out[:lanes]), maxF32Generic(x[blocks*lanes:]))
}

// max512 stores the lane-wise maxima of blocks×16 floats at p into out, NaN read as -Inf.
func max512(p unsafe.Pointer, blocks int, out *[16]float32) {
	ninf := archsimd.BroadcastFloat32x16(float32(math.Inf(-1)))
	ld := func(i int) archsimd.Float32x16 {
		v := archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p, i*64)))
		return v.Merge(ninf, v.Equal(v)) // NaN lanes (v != v) become -Inf
	}
	a0, a1, a2, a3 := ninf, ninf, ninf, ninf
	i := 0
	for ; i+4 <= blocks; i += 4 {
		a0 = a0.Max(ld(i))
		a1 = a1.Max(ld(i + 1))
		a2 = a2.Max(ld(i + 2))
		a3 = a3.Max(ld(i + 3))
	}
	for ; i < blocks; i++ {
		a0 = a0.Max(ld(i))
	}
	a0.Max(a1).Max(a2.Max(a3)).Store(out)
	archsimd.ClearAVXUpperBits()
}

// max256 is max512 with AVX2 vectors.
func max256(p unsafe.Pointer, blocks int, out *[8]float32) {
	ninf := archsimd.BroadcastFloat32x8(float32(math.Inf(-1)))
	ld := func(i int) archsimd.Float32x8 {
		v := archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(p, i*32)))
		return v.Merge(ninf, v.Equal(v))
	}
	a0, a1, a2, a3 := ninf, ninf, ninf, ninf
	i := 0
	for ; i+4 <= blocks; i += 4 {
		a0 = a0.Max(ld(i))
		a1 = a1.Max(ld(i + 1))
		a2 = a2.Max(ld(i + 2))
		a3 = a3.Max(ld(i + 3))
	}
	for ; i < blocks; i++ {
		a0 = a0.Max(ld(i))
	}
	a0.Max(a1).Max(a2.Max(a3)).Store(out)
	archsimd.ClearAVXUpperBits()
}

// expShiftedISA is ExpShifted (dst != nil) or SumExpShifted (dst == nil) on isa, in the
// canonical order: the kernels take 16 elements per step (one AVX-512 vector, two AVX2 ones)
// into 16 float64 partial sums, which fold16 adds. A tail shorter than 16 is padded with -Inf
// (which contributes exactly 0) and goes through the same kernel, so every element gets the
// same exponential and the same partial sum wherever it sits.
func expShiftedISA(isa vecISA, dst, x []float32, shift float32) float64 {
	if isa == isaGeneric {
		return expShiftedGeneric(dst, x, shift)
	}
	run := func(src, d unsafe.Pointer, blocks int, acc *[16]float64) {
		if isa == isaAVX512 {
			exp512(src, d, blocks, shift, acc)
		} else {
			exp256(src, d, blocks, shift, acc)
		}
	}
	blocks := len(x) / 16
	var acc [16]float64
	var dp unsafe.Pointer
	if dst != nil {
		dp = unsafe.Pointer(unsafe.SliceData(dst))
	}
	if blocks > 0 {
		run(unsafe.Pointer(unsafe.SliceData(x)), dp, blocks, &acc)
	}
	if rest := x[blocks*16:]; len(rest) > 0 {
		var buf [16]float32
		for i := range buf {
			buf[i] = float32(math.Inf(-1))
		}
		copy(buf[:], rest)
		bp := unsafe.Pointer(&buf)
		if dst == nil {
			run(bp, nil, 1, &acc)
		} else {
			run(bp, bp, 1, &acc)
			copy(dst[blocks*16:len(x)], buf[:len(rest)])
		}
	}
	return fold16(&acc)
}

// exp512 computes e_i = exp32(clamp(x_i - shift)) (0 for NaN and -Inf) for blocks×16 floats
// at x, stores them at dst unless it is nil, and adds lane j into the float64 partial sum
// acc[j] (lanes 0-7 and 8-15 in two float64 vectors).
func exp512(x, dst unsafe.Pointer, blocks int, shift float32, acc *[16]float64) {
	bc := archsimd.BroadcastFloat32x16
	sh := bc(shift)
	var zero archsimd.Float32x16 // not bc(0): that is a legacy-SSE XORPS after AVX-512 code
	lo, negMax := bc(expLo), bc(-math.MaxFloat32)
	log2e, ln2h, ln2l := bc(math.Log2E), bc(-expLn2H), bc(-expLn2L)
	p0, p1, p2, p3, p4, p5, one := bc(expP0), bc(expP1), bc(expP2), bc(expP3), bc(expP4), bc(expP5), bc(1)
	s0 := archsimd.LoadFloat64x8((*[8]float64)(acc[:8]))
	s1 := archsimd.LoadFloat64x8((*[8]float64)(acc[8:]))
	for i := range blocks {
		v := archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(x, i*64)))
		valid := v.GreaterEqual(negMax) // false for NaN and -Inf
		d := v.Sub(sh).Max(lo).Min(zero)
		k := d.Mul(log2e).RoundToEvenScaled(0)
		r := k.MulAdd(ln2h, d)
		r = k.MulAdd(ln2l, r)
		p := p0.MulAdd(r, p1)
		p = p.MulAdd(r, p2)
		p = p.MulAdd(r, p3)
		p = p.MulAdd(r, p4)
		p = p.MulAdd(r, p5)
		e := p.MulAdd(r.Mul(r), r.Add(one)).Scale(k).Masked(valid)
		if dst != nil {
			e.Store((*[16]float32)(unsafe.Add(dst, i*64)))
		}
		s0 = s0.Add(e.GetLo().ConvertToFloat64())
		s1 = s1.Add(e.GetHi().ConvertToFloat64())
	}
	s0.Store((*[8]float64)(acc[:8]))
	s1.Store((*[8]float64)(acc[8:]))
	archsimd.ClearAVXUpperBits()
}

// exp256 is exp512 with AVX2 vectors, two per 16-element step: 2^k is built in the exponent
// field, and the partial sums are four 4-lane float64 vectors.
func exp256(x, dst unsafe.Pointer, blocks int, shift float32, acc *[16]float64) {
	bc := archsimd.BroadcastFloat32x8
	sh := bc(shift)
	var zero archsimd.Float32x8
	lo, negMax := bc(expLo), bc(-math.MaxFloat32)
	log2e, ln2h, ln2l := bc(math.Log2E), bc(-expLn2H), bc(-expLn2L)
	p0, p1, p2, p3, p4, p5, one := bc(expP0), bc(expP1), bc(expP2), bc(expP3), bc(expP4), bc(expP5), bc(1)
	bias := archsimd.BroadcastInt32x8(127)
	ex := func(v archsimd.Float32x8) archsimd.Float32x8 {
		valid := v.GreaterEqual(negMax)
		d := v.Sub(sh).Max(lo).Min(zero)
		k := d.Mul(log2e).RoundToEven()
		r := k.MulAdd(ln2h, d)
		r = k.MulAdd(ln2l, r)
		p := p0.MulAdd(r, p1)
		p = p.MulAdd(r, p2)
		p = p.MulAdd(r, p3)
		p = p.MulAdd(r, p4)
		p = p.MulAdd(r, p5)
		scale := k.ConvertToInt32().Add(bias).ShiftAllLeft(23).AsFloat32x8()
		return p.MulAdd(r.Mul(r), r.Add(one)).Mul(scale).Masked(valid)
	}
	ld := func(i int) *[4]float64 { return (*[4]float64)(acc[i*4:]) }
	s0, s1 := archsimd.LoadFloat64x4(ld(0)), archsimd.LoadFloat64x4(ld(1))
	s2, s3 := archsimd.LoadFloat64x4(ld(2)), archsimd.LoadFloat64x4(ld(3))
	for i := range blocks {
		e0 := ex(archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(x, i*64))))
		e1 := ex(archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(x, i*64+32))))
		if dst != nil {
			e0.Store((*[8]float32)(unsafe.Add(dst, i*64)))
			e1.Store((*[8]float32)(unsafe.Add(dst, i*64+32)))
		}
		s0 = s0.Add(e0.GetLo().ConvertToFloat64())
		s1 = s1.Add(e0.GetHi().ConvertToFloat64())
		s2 = s2.Add(e1.GetLo().ConvertToFloat64())
		s3 = s3.Add(e1.GetHi().ConvertToFloat64())
	}
	s0.Store(ld(0))
	s1.Store(ld(1))
	s2.Store(ld(2))
	s3.Store(ld(3))
	archsimd.ClearAVXUpperBits()
}

func firstAtLeast(x []float32, v float32) int { return firstAtLeastISA(vecActive, x, v) }

// firstAtLeastISA is FirstAtLeast on isa: the vector loop finds the first whole vector with a
// hit (or none), the exact lane is then found in scalar code after the AVX state is cleared.
func firstAtLeastISA(isa vecISA, x []float32, v float32) int {
	var lanes, blk int
	p := unsafe.Pointer(unsafe.SliceData(x))
	switch isa {
	case isaAVX512:
		lanes = 16
		blk = firstGE512(p, len(x)/16, v)
	case isaAVX2:
		lanes = 8
		blk = firstGE256(p, len(x)/8, v)
	default:
		return firstAtLeastGeneric(x, v)
	}
	lo := blk * lanes // the vector with the hit, or the tail when there is none
	if i := firstAtLeastGeneric(x[lo:], v); i >= 0 {
		return lo + i
	}
	return -1
}

// firstGE512 returns the first of blocks 16-float vectors at p with an element >= v, or blocks.
func firstGE512(p unsafe.Pointer, blocks int, v float32) int {
	vv := archsimd.BroadcastFloat32x16(v)
	i := 0
	for ; i < blocks; i++ {
		if archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p, i*64))).GreaterEqual(vv).ToBits() != 0 {
			break
		}
	}
	archsimd.ClearAVXUpperBits()
	return i
}

// firstGE256 is firstGE512 with AVX2 vectors.
func firstGE256(p unsafe.Pointer, blocks int, v float32) int {
	vv := archsimd.BroadcastFloat32x8(v)
	i := 0
	for ; i < blocks; i++ {
		if archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(p, i*32))).GreaterEqual(vv).ToBits() != 0 {
			break
		}
	}
	archsimd.ClearAVXUpperBits()
	return i
}

func sumSquares(x []float32) float64 { return sumSquaresISA(vecActive, x) }

func scaleMul(dst, x, g []float32, s float32) { scaleMulISA(vecActive, dst, x, g, s) }

func swiglu(a, g, u []float32) { swigluISA(vecActive, a, g, u) }

// sumSquaresISA is the RMSNorm sum of squares on isa (the portable loop in this build; the
// default amd64 build has it in assembly).
func sumSquaresISA(_ vecISA, x []float32) float64 { return sumSquaresGeneric(x) }

// scaleMulISA is the RMSNorm scaling on isa (portable in this build, as sumSquaresISA).
func scaleMulISA(_ vecISA, dst, x, g []float32, s float32) { scaleMulGeneric(dst, x, g, s) }

// swigluISA is SwiGLU on isa (portable in this build, as sumSquaresISA).
func swigluISA(_ vecISA, a, g, u []float32) { swigluGeneric(a, g, u) }
