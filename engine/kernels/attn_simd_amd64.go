//go:build goexperiment.simd && amd64 && !purego

package kernels

import (
	"simd/archsimd"
	"unsafe"
)

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

func attnScores(scores, q, k []float32, stride, off, n int, scale float32) {
	attnScoresISA(vecActive, scores, q, k, stride, off, n, scale)
}

func attnAccum(out, p, v []float32, stride, off, n int) {
	attnAccumISA(vecActive, out, p, v, stride, off, n)
}

// attnScoresISA is AttnScores on isa (arguments checked). Scores are made four at a time; the
// last group of a block repeats its last row in the missing places and keeps only the real
// scores, so every score gets the same reduction tree wherever it sits.
func attnScoresISA(isa vecISA, scores, q, k []float32, stride, off, n int, scale float32) {
	hd := len(q)
	isa = attnISA(isa, hd)
	if isa == isaGeneric {
		attnScoresGeneric(scores, q, k, stride, off, n, scale)
		return
	}
	qp := unsafe.Pointer(unsafe.SliceData(q))
	kp := unsafe.Pointer(&k[off])
	sp := unsafe.Pointer(unsafe.SliceData(scores))
	var tail [4]float32
	if isa == isaAVX512 {
		scores512(qp, kp, stride*4, n, hd/16, scale, sp, &tail)
	} else {
		scores256(qp, kp, stride*4, n, hd/8, scale, sp, &tail)
	}
	if full := n &^ 3; full < n {
		copy(scores[full:n], tail[:n-full])
	}
}

// scores512 computes n scores of rows at k (rs bytes apart) against q (nch×16 floats) into
// out, the last partial group of four into tail.
func scores512(q, k unsafe.Pointer, rs, n, nch int, scale float32, out unsafe.Pointer, tail *[4]float32) {
	sc := archsimd.BroadcastFloat32x4(scale)
	ld := func(p unsafe.Pointer, off int) archsimd.Float32x16 {
		return archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p, off)))
	}
	// fold16's first two levels (lanes j+8, then j+4), then lanes 0 2 1 3 so that the two
	// AddPairs below finish it as (b0+b2)+(b1+b3) for four rows at once.
	fold := func(a archsimd.Float32x16) archsimd.Float32x4 {
		h := a.GetLo().Add(a.GetHi())
		f := h.GetLo().Add(h.GetHi())
		return f.SelectFromPair(0, 2, 1, 3, f)
	}
	for s := 0; s < n; s += 4 {
		r0 := unsafe.Add(k, s*rs)
		r1 := unsafe.Add(k, min(s+1, n-1)*rs)
		r2 := unsafe.Add(k, min(s+2, n-1)*rs)
		r3 := unsafe.Add(k, min(s+3, n-1)*rs)
		var a0, a1, a2, a3 archsimd.Float32x16
		for j := range nch {
			o := j * 64
			qj := ld(q, o)
			a0 = qj.MulAdd(ld(r0, o), a0)
			a1 = qj.MulAdd(ld(r1, o), a1)
			a2 = qj.MulAdd(ld(r2, o), a2)
			a3 = qj.MulAdd(ld(r3, o), a3)
		}
		w := fold(a0).AddPairs(fold(a1)).AddPairs(fold(a2).AddPairs(fold(a3))).Mul(sc)
		if s+4 <= n {
			w.Store((*[4]float32)(unsafe.Add(out, s*4)))
		} else {
			w.Store(tail)
		}
	}
	archsimd.ClearAVXUpperBits()
}

// scores256 is scores512 with AVX2 vectors (q is nch×8 floats): canonical lanes 0-7 and 8-15
// of a row are two vectors, a (even chunks) and b (odd chunks), and fold adds b to a first.
func scores256(q, k unsafe.Pointer, rs, n, nch int, scale float32, out unsafe.Pointer, tail *[4]float32) {
	sc := archsimd.BroadcastFloat32x4(scale)
	ld := func(p unsafe.Pointer, off int) archsimd.Float32x8 {
		return archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(p, off)))
	}
	fold := func(a, b archsimd.Float32x8) archsimd.Float32x4 {
		h := a.Add(b)
		f := h.GetLo().Add(h.GetHi())
		return f.SelectFromPair(0, 2, 1, 3, f)
	}
	for s := 0; s < n; s += 4 {
		r0 := unsafe.Add(k, s*rs)
		r1 := unsafe.Add(k, min(s+1, n-1)*rs)
		r2 := unsafe.Add(k, min(s+2, n-1)*rs)
		r3 := unsafe.Add(k, min(s+3, n-1)*rs)
		var a0, a1, a2, a3, b0, b1, b2, b3 archsimd.Float32x8
		j := 0
		for ; j+2 <= nch; j += 2 {
			o := j * 32
			qa, qb := ld(q, o), ld(q, o+32)
			a0 = qa.MulAdd(ld(r0, o), a0)
			a1 = qa.MulAdd(ld(r1, o), a1)
			a2 = qa.MulAdd(ld(r2, o), a2)
			a3 = qa.MulAdd(ld(r3, o), a3)
			b0 = qb.MulAdd(ld(r0, o+32), b0)
			b1 = qb.MulAdd(ld(r1, o+32), b1)
			b2 = qb.MulAdd(ld(r2, o+32), b2)
			b3 = qb.MulAdd(ld(r3, o+32), b3)
		}
		if j < nch {
			o := j * 32
			qa := ld(q, o)
			a0 = qa.MulAdd(ld(r0, o), a0)
			a1 = qa.MulAdd(ld(r1, o), a1)
			a2 = qa.MulAdd(ld(r2, o), a2)
			a3 = qa.MulAdd(ld(r3, o), a3)
		}
		w := fold(a0, b0).AddPairs(fold(a1, b1)).AddPairs(fold(a2, b2).AddPairs(fold(a3, b3))).Mul(sc)
		if s+4 <= n {
			w.Store((*[4]float32)(unsafe.Add(out, s*4)))
		} else {
			w.Store(tail)
		}
	}
	archsimd.ClearAVXUpperBits()
}

// attnAccumISA is AttnAccum on isa (arguments checked).
func attnAccumISA(isa vecISA, out, p, v []float32, stride, off, n int) {
	hd := len(out)
	isa = attnISA(isa, hd)
	if isa == isaGeneric {
		attnAccumGeneric(out, p, v, stride, off, n)
		return
	}
	op := unsafe.Pointer(unsafe.SliceData(out))
	pp := unsafe.Pointer(unsafe.SliceData(p))
	vp := unsafe.Pointer(&v[off])
	if isa == isaAVX512 {
		accum512(op, pp, vp, stride*4, n, hd/16)
	} else {
		accum256(op, pp, vp, stride*4, n, hd/8)
	}
}

// accum512 adds Σ_s p[s]·row_s to out (nch×16 floats), rows at v rs bytes apart: per 16-float
// chunk, the canonical four chains over slots s mod 4, then out += (a0+a1)+(a2+a3).
func accum512(out, p, v unsafe.Pointer, rs, n, nch int) {
	ld := func(q unsafe.Pointer, off int) archsimd.Float32x16 {
		return archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(q, off)))
	}
	bc := func(s int) archsimd.Float32x16 {
		return archsimd.BroadcastFloat32x16(*(*float32)(unsafe.Add(p, s*4)))
	}
	for j := range nch {
		o := j * 64
		var a0, a1, a2, a3 archsimd.Float32x16
		s := 0
		for ; s+4 <= n; s += 4 {
			r := unsafe.Add(v, s*rs+o)
			a0 = bc(s).MulAdd(ld(r, 0), a0)
			a1 = bc(s+1).MulAdd(ld(r, rs), a1)
			a2 = bc(s+2).MulAdd(ld(r, 2*rs), a2)
			a3 = bc(s+3).MulAdd(ld(r, 3*rs), a3)
		}
		if s < n { // the last slots keep their chains s mod 4
			a0 = bc(s).MulAdd(ld(v, s*rs+o), a0)
			if s+1 < n {
				a1 = bc(s+1).MulAdd(ld(v, (s+1)*rs+o), a1)
			}
			if s+2 < n {
				a2 = bc(s+2).MulAdd(ld(v, (s+2)*rs+o), a2)
			}
		}
		ld(out, o).Add(a0.Add(a1).Add(a2.Add(a3))).Store((*[16]float32)(unsafe.Add(out, o)))
	}
	archsimd.ClearAVXUpperBits()
}

// accum256 is accum512 with AVX2 vectors (out is nch×8 floats).
func accum256(out, p, v unsafe.Pointer, rs, n, nch int) {
	ld := func(q unsafe.Pointer, off int) archsimd.Float32x8 {
		return archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(q, off)))
	}
	bc := func(s int) archsimd.Float32x8 {
		return archsimd.BroadcastFloat32x8(*(*float32)(unsafe.Add(p, s*4)))
	}
	for j := range nch {
		o := j * 32
		var a0, a1, a2, a3 archsimd.Float32x8
		s := 0
		for ; s+4 <= n; s += 4 {
			r := unsafe.Add(v, s*rs+o)
			a0 = bc(s).MulAdd(ld(r, 0), a0)
			a1 = bc(s+1).MulAdd(ld(r, rs), a1)
			a2 = bc(s+2).MulAdd(ld(r, 2*rs), a2)
			a3 = bc(s+3).MulAdd(ld(r, 3*rs), a3)
		}
		if s < n { // the last slots keep their chains s mod 4
			a0 = bc(s).MulAdd(ld(v, s*rs+o), a0)
			if s+1 < n {
				a1 = bc(s+1).MulAdd(ld(v, (s+1)*rs+o), a1)
			}
			if s+2 < n {
				a2 = bc(s+2).MulAdd(ld(v, (s+2)*rs+o), a2)
			}
		}
		ld(out, o).Add(a0.Add(a1).Add(a2.Add(a3))).Store((*[8]float32)(unsafe.Add(out, o)))
	}
	archsimd.ClearAVXUpperBits()
}
