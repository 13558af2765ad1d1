//go:build ignore

// gen_w8a8 writes the W8A8 tiles, each a loop over the blocks of Int8Block columns: the AVX2
// ones (w8a8_avx2_amd64.s), one panel (16 rows, two 8-row halves) × T tokens, T =
// 1..w8a8MaxT, and the AVX-512 VNNI ones (w8a8_vnni_amd64.s), one and two panels × T
// tokens.
//
//	go run gen_w8a8.go
package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

const (
	maxT       = 4   // w8a8MaxT
	blockBytes = 544 // w8a8BlockBytes: 16 float16 scales, 8 groups of 16 rows × 4 bytes
	scaleBytes = 32  // w8a8ScaleBytes
	// blockLines is the cache lines a prefetch of one block touches: 544 bytes start half-way
	// into a line every other block, so 9 lines, not 8.
	blockLines = (blockBytes + 63) / 64
	regFloatT  = 2 // up to this many tokens keep their float accumulators in registers
)

var b bytes.Buffer

func emit(format string, args ...any) { fmt.Fprintf(&b, "\t"+format+"\n", args...) }

// addr is the operand at byte off from token t's row, given the base register and the
// registers holding one and three token strides.
func addr(off, t int, base, s1, s3 string) string {
	switch t {
	case 0:
		return fmt.Sprintf("%d(%s)", off, base)
	case 1:
		return fmt.Sprintf("%d(%s)(%s*1)", off, base, s1)
	case 2:
		return fmt.Sprintf("%d(%s)(%s*2)", off, base, s1)
	}
	return fmt.Sprintf("%d(%s)(%s*1)", off, base, s3)
}

// prologue starts tile name: its signature comment, TEXT, and the arguments every tile loads
// the same way: the weights in SI, the block count in CX, the inputs in DI with one and three
// token strides in R9 and R10, the input scales in R8.
func prologue(name string) {
	fmt.Fprintf(&b, "\n// func %s(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)\n", name)
	fmt.Fprintf(&b, "TEXT ·%s(SB), NOSPLIT, $0-64\n", name)
	emit("MOVQ w+0(FP), SI")
	emit("MOVQ nb+8(FP), CX")
	emit("MOVQ x+16(FP), DI")
	emit("MOVQ xs+24(FP), R9")
	emit("LEAQ (R9)(R9*2), R10")
	emit("MOVQ s+32(FP), R8")
}

// nextBlock ends tile name's block loop: the weights, inputs and input scales move on one
// block, and the store follows.
func nextBlock(name string) {
	emit("ADDQ $%d, SI", blockBytes)
	emit("ADDQ $32, DI")
	emit("ADDQ $4, R8")
	emit("DECQ CX")
	emit("JNZ %s_block", name)
	fmt.Fprintf(&b, "%s_store:\n", name)
}

func tile(T int) {
	name := fmt.Sprintf("w8a8T%d", T)
	regFloat := T <= regFloatT
	iacc := func(t, h int) string { return fmt.Sprintf("Y%d", 2*t+h) }
	facc := func(t, h int) string { return fmt.Sprintf("Y%d", 4+2*t+h) } // regFloat only
	xb := func(t int) string { return []string{"Y10", "Y12", "Y13", "Y14"}[t] }
	x := func(off, t int) string { return addr(off, t, "DI", "R9", "R10") }
	s := func(t int) string { return addr(0, t, "R8", "BX", "R11") }
	y := func(off, t int) string { return addr(off, t, "DX", "R12", "R13") }

	prologue(name)
	emit("MOVQ ss+40(FP), BX")
	emit("LEAQ (BX)(BX*2), R11")
	emit("MOVQ y+48(FP), DX")
	emit("MOVQ ys+56(FP), R12")
	emit("LEAQ (R12)(R12*2), R13")
	emit("VPCMPEQW Y15, Y15, Y15")
	emit("VPSRLW $15, Y15, Y15") // int16 ones, for VPMADDWD
	if regFloat {
		for t := range T {
			for h := range 2 {
				emit("VXORPS %s, %s, %s", facc(t, h), facc(t, h), facc(t, h))
			}
		}
	} else {
		emit("VXORPS Y12, Y12, Y12")
		for t := range T {
			for h := range 2 {
				emit("VMOVUPS Y12, %s", y(32*h, t))
			}
		}
	}
	emit("TESTQ CX, CX")
	emit("JEQ %s_store", name)
	fmt.Fprintf(&b, "%s_block:\n", name)
	if pf := prefetchAhead(T); pf > 0 {
		for l := range blockLines {
			emit("PREFETCHT0 %d(SI)", pf+64*l)
		}
	}
	for g := range 8 {
		for t := range T {
			emit("VPBROADCASTD %s, %s", x(4*g, t), xb(t))
		}
		for h := range 2 {
			emit("VMOVDQU %d(SI), Y8", scaleBytes+64*g+32*h)
			emit("VPABSB Y8, Y9")
			for t := range T {
				// Y11 = x with w's signs; |w|·that, pairs summed to int16 (at most
				// 2·127·127, no saturation), then pairs of those to int32.
				emit("VPSIGNB Y8, %s, Y11", xb(t))
				emit("VPMADDUBSW Y11, Y9, Y11")
				if g == 0 {
					emit("VPMADDWD Y15, Y11, %s", iacc(t, h))
				} else {
					emit("VPMADDWD Y15, Y11, Y11")
					emit("VPADDD Y11, %s, %s", iacc(t, h), iacc(t, h))
				}
			}
		}
	}
	// The block's integer sums are exact; fold them in: acc = fma(float32(isum), ws·xs, acc),
	// ws widened from float16 (exactly) by VCVTPH2PS once per block, into the registers the
	// weights no longer need.
	emit("VCVTPH2PS 0(SI), Y8")
	emit("VCVTPH2PS 16(SI), Y9")
	for t := range T {
		emit("VBROADCASTSS %s, Y10", s(t))
		for h := range 2 {
			emit("VCVTDQ2PS %s, %s", iacc(t, h), iacc(t, h))
			emit("VMULPS Y%d, Y10, Y11", 8+h)
			if regFloat {
				emit("VFMADD231PS Y11, %s, %s", iacc(t, h), facc(t, h))
			} else {
				emit("VMOVUPS %s, Y12", y(32*h, t))
				emit("VFMADD231PS Y11, %s, Y12", iacc(t, h))
				emit("VMOVUPS Y12, %s", y(32*h, t))
			}
		}
	}
	nextBlock(name)
	if regFloat {
		for t := range T {
			for h := range 2 {
				emit("VMOVUPS %s, %s", facc(t, h), y(32*h, t))
			}
		}
	}
	emit("VZEROUPPER")
	emit("RET")
}

// prefetchAhead is how far ahead of the block the tiles prefetch (PREFETCHT0 of each line of
// the block that far on), 0 for not at all, the default: on the 2-core EPYC the batch-1 matvec
// with the two-panel tile (two streams for the hardware prefetcher) read 25-28 GB/s of
// weights without software prefetch and 18-22 GB/s with it, 2 to 8 KB ahead
// (BenchmarkMatMulPrecision's shape, a shared machine). W8A8_PF=bytes generates it, to
// measure elsewhere.
func prefetchAhead(T int) int {
	if v := os.Getenv("W8A8_PF"); v != "" {
		n, _ := strconv.Atoi(v)
		return n
	}
	return 0
}

// tileP2 writes the two-panel one-token tile w8a8P2T1: the second panel follows the first
// (nb blocks on), and its outputs follow the first's in y. Per panel two integer sums and two
// float32 accumulators in registers.
func tileP2() {
	name := "w8a8P2T1"
	iacc := func(j, h int) string { return fmt.Sprintf("Y%d", 2*j+h) }
	facc := func(j, h int) string { return fmt.Sprintf("Y%d", 4+2*j+h) }
	w := func(off, j int) string {
		if j == 0 {
			return fmt.Sprintf("%d(SI)", off)
		}
		return fmt.Sprintf("%d(SI)(R14*1)", off)
	}
	prologue(name)
	emit("MOVQ y+48(FP), DX")
	emit("IMUL3Q $%d, CX, R14", blockBytes) // the panel stride
	emit("VPCMPEQW Y15, Y15, Y15")
	emit("VPSRLW $15, Y15, Y15")
	for j := range 2 {
		for h := range 2 {
			emit("VXORPS %s, %s, %s", facc(j, h), facc(j, h), facc(j, h))
		}
	}
	emit("TESTQ CX, CX")
	emit("JEQ %s_store", name)
	fmt.Fprintf(&b, "%s_block:\n", name)
	if pf := prefetchAhead(1); pf > 0 {
		for j := range 2 {
			for l := range blockLines {
				emit("PREFETCHT0 %s", w(pf+64*l, j))
			}
		}
	}
	for g := range 8 {
		emit("VPBROADCASTD %d(DI), Y10", 4*g)
		for j := range 2 {
			for h := range 2 {
				emit("VMOVDQU %s, Y8", w(scaleBytes+64*g+32*h, j))
				emit("VPABSB Y8, Y9")
				emit("VPSIGNB Y8, Y10, Y11")
				emit("VPMADDUBSW Y11, Y9, Y11")
				if g == 0 {
					emit("VPMADDWD Y15, Y11, %s", iacc(j, h))
				} else {
					emit("VPMADDWD Y15, Y11, Y11")
					emit("VPADDD Y11, %s, %s", iacc(j, h), iacc(j, h))
				}
			}
		}
	}
	emit("VBROADCASTSS (R8), Y10")
	for j := range 2 {
		for h := range 2 {
			emit("VCVTDQ2PS %s, %s", iacc(j, h), iacc(j, h))
			emit("VCVTPH2PS %s, Y11", w(16*h, j))
			emit("VMULPS Y11, Y10, Y11")
			emit("VFMADD231PS Y11, %s, %s", iacc(j, h), facc(j, h))
		}
	}
	nextBlock(name)
	for j := range 2 {
		for h := range 2 {
			emit("VMOVUPS %s, %d(DX)", facc(j, h), 64*j+32*h)
		}
	}
	emit("VZEROUPPER")
	emit("RET")
}

// vnniPrefetch is how far ahead the prefetching two-panel VNNI tiles (w8a8VP2T<T>PF) prefetch
// (PREFETCHT0 of each line of the block that far on): two blocks. On a 2-vCPU AVX-512 Xeon
// (BenchmarkW8A8Kernels, four interleaved rounds) two panels with it streamed 30.1-31.1 GB/s
// of weights, without it 26.4-28.8, four panels 27.7-28.2 without and 29.4-29.7 with; on a
// Zen 5 EPYC 4, 8 and 16 blocks were slower than 2. On a Zen 4 EPYC it costs a fifth to a
// third of the stream, so the plain tiles are written too (batch1Prefetches chooses).
const vnniPrefetch = 2 * blockBytes

// vnniTile writes the AVX-512 VNNI tile w8a8VP<P>T<T>: P whole panels (each nb blocks after
// the one before, its outputs 16 after) × T tokens, P = 1 or 2. A group of 4
// columns of a panel is one ZMM register (16 rows × 4 int8), so VPDPBUSD adds a token's 4
// inputs times each row's 4 weights into the row's int32 in one instruction. Its first
// operand is unsigned: the input's bytes go in with their sign bit flipped (x+128, VPXORD
// with 0x80 bytes), and the panel's Σ 128·w (VPDPBUSD of the weights by 0x80 bytes, shared
// by the tokens) comes off at the block's end. Both sums are exact int32s (|Σ| ≤
// 32·255·127), so the block's integer sums, and from them everything, are W8A8's definition
// bit for bit, as in the AVX2 tiles. pf > 0 prefetches that many bytes ahead, and the
// tile's name ends in PF.
func vnniTile(P, T, pf int) {
	name := fmt.Sprintf("w8a8VP%dT%d", P, T)
	if pf > 0 {
		name += "PF"
	}
	facc := func(p, t int) string { return fmt.Sprintf("Z%d", p*T+t) }
	iacc := func(p, t int) string { return fmt.Sprintf("Z%d", P*T+p*T+t) }
	corr := func(p int) string { return fmt.Sprintf("Z%d", 2*P*T+p) }
	wr := func(p int) string { return fmt.Sprintf("Z%d", 24+p) }
	const xr, tmp, bias = "Z28", "Z30", "Z31"
	// Panel p's bytes at off: SI, then R14 (the panel stride) times 1, 2 or 3 (in BX).
	w := func(off, p int) string {
		return []string{fmt.Sprintf("%d(SI)", off), fmt.Sprintf("%d(SI)(R14*1)", off),
			fmt.Sprintf("%d(SI)(R14*2)", off), fmt.Sprintf("%d(SI)(BX*1)", off)}[p]
	}
	x := func(off, t int) string { return addr(off, t, "DI", "R9", "R10") }
	s := func(t int) string { return addr(0, t, "R8", "R11", "R12") }

	prologue(name)
	emit("MOVQ ss+40(FP), R11")
	emit("LEAQ (R11)(R11*2), R12")
	emit("IMUL3Q $%d, CX, R14", blockBytes)
	emit("LEAQ (R14)(R14*2), BX")
	emit("MOVL $0x80808080, AX")
	emit("VPBROADCASTD AX, %s", bias)
	for p := range P {
		for t := range T {
			emit("VPXORD %s, %s, %s", facc(p, t), facc(p, t), facc(p, t))
		}
	}
	emit("TESTQ CX, CX")
	emit("JEQ %s_store", name)
	fmt.Fprintf(&b, "%s_block:\n", name)
	for p := range P {
		emit("VPXORD %s, %s, %s", corr(p), corr(p), corr(p))
		for t := range T {
			emit("VPXORD %s, %s, %s", iacc(p, t), iacc(p, t), iacc(p, t))
		}
	}
	if pf > 0 {
		for p := range P {
			for l := range blockLines {
				emit("PREFETCHT0 %s", w(pf+64*l, p))
			}
		}
	}
	for g := range 8 {
		for p := range P {
			emit("VMOVDQU64 %s, %s", w(scaleBytes+64*g, p), wr(p))
			emit("VPDPBUSD %s, %s, %s", wr(p), bias, corr(p))
		}
		for t := range T {
			emit("VPBROADCASTD %s, %s", x(4*g, t), xr)
			emit("VPXORD %s, %s, %s", bias, xr, xr)
			for p := range P {
				emit("VPDPBUSD %s, %s, %s", wr(p), xr, iacc(p, t))
			}
		}
	}
	// acc = fma(float32(isum), ws·xs, acc), isum = Σ(x+128)·w − Σ128·w.
	for p := range P {
		emit("VCVTPH2PS %s, %s", w(0, p), wr(p)) // the 16 float16 scales, widened exactly
	}
	for t := range T {
		emit("VBROADCASTSS %s, %s", s(t), xr)
		for p := range P {
			emit("VPSUBD %s, %s, %s", corr(p), iacc(p, t), iacc(p, t))
			emit("VCVTDQ2PS %s, %s", iacc(p, t), iacc(p, t))
			emit("VMULPS %s, %s, %s", wr(p), xr, tmp)
			emit("VFMADD231PS %s, %s, %s", tmp, iacc(p, t), facc(p, t))
		}
	}
	nextBlock(name)
	emit("MOVQ y+48(FP), DX")
	emit("MOVQ ys+56(FP), R9")
	emit("LEAQ (R9)(R9*2), R10")
	for p := range P {
		for t := range T {
			emit("VMOVUPS %s, %s", facc(p, t), addr(64*p, t, "DX", "R9", "R10"))
		}
	}
	emit("VZEROUPPER")
	emit("RET")
}

func write(name string) {
	if err := os.WriteFile(name, b.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	b.Reset()
}

const header = "// Code generated by gen_w8a8.go; DO NOT EDIT.\n\n//go:build amd64 && !purego\n\n#include \"textflag.h\"\n"

func main() {
	b.WriteString(header)
	for T := 1; T <= maxT; T++ {
		tile(T)
	}
	tileP2()
	write("w8a8_avx2_amd64.s")
	b.WriteString(header)
	for T := 1; T <= maxT; T++ {
		vnniTile(1, T, 0)
	}
	vnniTile(2, 1, 0)
	vnniTile(2, 1, vnniPrefetch)
	for T := 2; T <= maxT; T++ {
		vnniTile(2, T, 0)
		vnniTile(2, T, vnniPrefetch)
	}
	write("w8a8_vnni_amd64.s")
}
