package kernels

import (
	"fmt"
	"unsafe"
)

// The attention kernels work on one (token, head) and one block of cached positions at a time:
// rows s = 0..n-1 of a block live at k[s*stride+off:][:len(q)] (likewise v), which is how a
// paged KV block stores a head (stride = kv_dim, off = kv_head*head_dim). Results depend only on
// q, the rows and n, never on how many tokens or heads a step processes, nor on the kernel
// path: every path computes the canonical order of the package doc, bit for bit.

// AttnScores writes scores[s] = scale · Σ_i q[i]·k[s*stride+off+i] for s < n. Each score is
// reduced in the canonical order: element i goes into FMA chain i mod 16 (in increasing i,
// from zero), the 16 chains are added in the canonical tree, and the sum is multiplied by
// scale; the same for every s and every n.
func AttnScores(scores, q, k []float32, stride, off, n int, scale float32) {
	if n <= 0 {
		return
	}
	checkRows("AttnScores", len(scores), n, len(q), k, stride, off)
	attnScores(scores[:n], q, k, stride, off, n, scale)
}

// AttnAccum adds Σ_s p[s]·v[s*stride+off+i] over s < n to out[i], for i < len(out) (the head
// width). The order is canonical: per element, four FMA chains a0..a3 (slot s into chain
// s mod 4, in slot order, from zero), then out[i] + ((a0+a1)+(a2+a3)).
func AttnAccum(out, p, v []float32, stride, off, n int) {
	if n <= 0 {
		return
	}
	checkRows("AttnAccum", len(p), n, len(out), v, stride, off)
	attnAccum(out, p[:n], v, stride, off, n)
}

// PrefetchRows asks the CPU to start loading the rows an AttnScores or AttnAccum call with the
// same stride, off, n and width would read, and returns without waiting for them; it changes
// no value. The attention loop calls it for the call after the one it is about to make: a
// many-sequence step reads most of its K/V from DRAM, one head-wide strip per row (256 bytes
// 3 KB apart on stories110m), a pattern the hardware prefetchers do not follow, so without
// the hint every call stalls on its own misses (BenchmarkAttentionBatch in engine/model).
// It is a no-op in the portable build.
func PrefetchRows(x []float32, stride, off, n, width int) {
	if n <= 0 {
		return
	}
	checkRows("PrefetchRows", n, n, width, x, stride, off)
	// Lines per row: the first row's offset into its line, or the worst case if rows sit at
	// different offsets.
	p, mis := &x[off], 63
	if stride*4%64 == 0 {
		mis = int(uintptr(unsafe.Pointer(p)) % 64)
	}
	prefetchRows(p, stride*4, n, (mis+width*4+63)/64)
}

// checkRows panics unless n rows of hd > 0 floats at stride from off fit in rows and buf
// holds n values: the SIMD kernels read through raw pointers.
func checkRows(name string, buf, n, hd int, rows []float32, stride, off int) {
	if buf < n || hd <= 0 || off < 0 || stride < 0 || (n > 1 && stride < hd) || len(rows) < (n-1)*stride+off+hd {
		panic(fmt.Sprintf("kernels: %s: n=%d width=%d stride=%d off=%d: len(rows)=%d, buffer %d",
			name, n, hd, stride, off, len(rows), buf))
	}
}

// attnScoresGeneric is AttnScores in portable Go.
func attnScoresGeneric(scores, q, k []float32, stride, off, n int, scale float32) {
	hd := len(q)
	for s := range n {
		scores[s] = dotGeneric(q, k[s*stride+off:s*stride+off+hd]) * scale
	}
}

// dotGeneric is the canonical dot product: 16 FMA chains (element i into chain i mod 16)
// folded by fold16.
func dotGeneric(a, b []float32) float32 {
	b = b[:len(a)]
	var acc [16]float32
	i := 0
	for ; i+16 <= len(a); i += 16 {
		x, y := (*[16]float32)(a[i:]), (*[16]float32)(b[i:])
		for j := range acc {
			f, ok := fmaFast(x[j], y[j], acc[j])
			if !ok {
				f = fma32Slow(x[j], y[j], acc[j])
			}
			acc[j] = f
		}
	}
	for j := range a[i:] {
		acc[j] = fma32(a[i+j], b[i+j], acc[j])
	}
	return fold16(&acc)
}

// attnAccumGeneric is AttnAccum in portable Go, 16 output elements at a time so that the four
// chains of each element stay in registers or L1.
func attnAccumGeneric(out, p, v []float32, stride, off, n int) {
	hd := len(out)
	p = p[:n]
	for i0 := 0; i0 < hd; i0 += 16 {
		w := min(16, hd-i0)
		var acc [4][16]float32
		for s, ps := range p {
			row := v[s*stride+off+i0 : s*stride+off+i0+w]
			a := &acc[s&3]
			for j, x := range row {
				f, ok := fmaFast(ps, x, a[j])
				if !ok {
					f = fma32Slow(ps, x, a[j])
				}
				a[j] = f
			}
		}
		o := out[i0 : i0+w]
		for j := range o {
			o[j] += (acc[0][j] + acc[1][j]) + (acc[2][j] + acc[3][j])
		}
	}
}
