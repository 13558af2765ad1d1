package kernels

import "fmt"

// The attention kernels work on one (token, head) and one block of cached positions at a time:
// rows s = 0..n-1 of a block live at k[s*stride+off:][:len(q)] (likewise v), which is how a
// paged KV block stores a head (stride = kv_dim, off = kv_head*head_dim). Results depend only on
// q, the rows and n, never on how many tokens or heads a step processes. The SIMD paths
// vectorise over the head dimension (AVX-512 when it is a multiple of 16, AVX2 for multiples of
// 8; other widths use the portable loops).

// AttnScores writes scores[s] = scale · Σ_i q[i]·k[s*stride+off+i] for s < n. Each score is
// reduced in one fixed order (per-lane FMA chains over the head, then a fixed lane tree), the
// same for every s and every n.
func AttnScores(scores, q, k []float32, stride, off, n int, scale float32) {
	if n <= 0 {
		return
	}
	checkRows("AttnScores", len(scores), n, q, k, stride, off)
	attnScores(scores[:n], q, k, stride, off, n, scale)
}

// AttnAccum adds Σ_s p[s]·v[s*stride+off+i] over s < n to out[i], for i < len(out) (the head
// width). The order is fixed by n: the SIMD paths keep four partial sums (slots s mod 4, each
// in slot order) and add them to out as ((a0+a1)+(a2+a3)).
func AttnAccum(out, p, v []float32, stride, off, n int) {
	if n <= 0 {
		return
	}
	checkRows("AttnAccum", len(p), n, out, v, stride, off)
	attnAccum(out, p[:n], v, stride, off, n)
}

// checkRows panics unless n rows of width len(vec) at stride from off fit in rows and buf
// holds n values: the SIMD kernels read through raw pointers.
func checkRows(name string, buf, n int, vec, rows []float32, stride, off int) {
	hd := len(vec)
	if buf < n || hd == 0 || off < 0 || stride < 0 || (n > 1 && stride < hd) || len(rows) < (n-1)*stride+off+hd {
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

// dotGeneric uses four accumulators in a fixed pattern: the order depends only on len(a).
func dotGeneric(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// attnAccumGeneric is AttnAccum in portable Go: one axpy per slot, in slot order.
func attnAccumGeneric(out, p, v []float32, stride, off, n int) {
	hd := len(out)
	for s := range n {
		ps := p[s]
		row := v[s*stride+off : s*stride+off+hd]
		for i := range out {
			out[i] += ps * row[i]
		}
	}
}
