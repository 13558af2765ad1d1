//go:build arm64 && !purego

#include "textflag.h"

// The Go assembler has no vector FADD, so it is written as WORD with the instruction beside it.

// func attnScoresNEON(scores, q, k unsafe.Pointer, stride, n, blocks int, scale float32)
//
// scores[s] = scale · dot(q, row s) for s < n, row s at k + s*stride bytes, each dot over
// blocks×16 elements: 16 VFMLA chains (element i into chain i mod 16) in V0-V3, folded in the
// canonical tree.
TEXT ·attnScoresNEON(SB), NOSPLIT, $0-52
	MOVD scores+0(FP), R0
	MOVD q+8(FP), R1
	MOVD k+16(FP), R2
	MOVD stride+24(FP), R3
	MOVD n+32(FP), R4
	MOVD blocks+40(FP), R5
	FMOVS scale+48(FP), F30
scores_row:
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16
	MOVD R1, R6
	MOVD R2, R7
	MOVD R5, R8
scores_block:
	VLD1.P 64(R6), [V4.S4, V5.S4, V6.S4, V7.S4]
	VLD1.P 64(R7), [V8.S4, V9.S4, V10.S4, V11.S4]
	VFMLA V4.S4, V8.S4, V0.S4
	VFMLA V5.S4, V9.S4, V1.S4
	VFMLA V6.S4, V10.S4, V2.S4
	VFMLA V7.S4, V11.S4, V3.S4
	SUBS $1, R8, R8
	BNE scores_block
	// Lanes j+8 into j, then j+4 into j: (V0+V2)+(V1+V3); then (p0+p2)+(p1+p3).
	WORD $0x4e22d400 // FADD V0.4S, V0.4S, V2.4S
	WORD $0x4e23d421 // FADD V1.4S, V1.4S, V3.4S
	WORD $0x4e21d400 // FADD V0.4S, V0.4S, V1.4S
	VEXT $8, V0.B16, V0.B16, V1.B16
	WORD $0x4e21d400 // FADD V0.4S, V0.4S, V1.4S
	VDUP V0.S[1], V1.S4
	FADDS F1, F0, F0
	FMULS F30, F0, F0
	FMOVS.P F0, 4(R0)
	ADD R3, R2, R2
	SUBS $1, R4, R4
	BNE scores_row
	RET

// func attnAccumNEON(out, p, v unsafe.Pointer, stride, n, blocks int)
//
// out[i] += (a0+a1)+(a2+a3) for i < blocks×16, chain c = Σ_{s mod 4 = c} p[s]·v[s][i] as a
// VFMLA chain in slot order, row s at v + s*stride bytes. Chain c of a 16-element block is
// V(4c)..V(4c+3).
TEXT ·attnAccumNEON(SB), NOSPLIT, $0-48
	MOVD out+0(FP), R0
	MOVD p+8(FP), R1
	MOVD v+16(FP), R2
	MOVD stride+24(FP), R3
	MOVD n+32(FP), R4
	MOVD blocks+40(FP), R5
	LSR $2, R4, R9
	AND $3, R4, R10
accum_block:
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16
	VEOR V4.B16, V4.B16, V4.B16
	VEOR V5.B16, V5.B16, V5.B16
	VEOR V6.B16, V6.B16, V6.B16
	VEOR V7.B16, V7.B16, V7.B16
	VEOR V8.B16, V8.B16, V8.B16
	VEOR V9.B16, V9.B16, V9.B16
	VEOR V10.B16, V10.B16, V10.B16
	VEOR V11.B16, V11.B16, V11.B16
	VEOR V12.B16, V12.B16, V12.B16
	VEOR V13.B16, V13.B16, V13.B16
	VEOR V14.B16, V14.B16, V14.B16
	VEOR V15.B16, V15.B16, V15.B16
	MOVD R1, R6
	MOVD R2, R7
	CBZ R9, accum_tail
	MOVD R9, R8
accum_group:
	VLD1R.P 4(R6), [V16.S4]
	VLD1.P (R7)(R3), [V20.S4, V21.S4, V22.S4, V23.S4]
	VFMLA V20.S4, V16.S4, V0.S4
	VFMLA V21.S4, V16.S4, V1.S4
	VFMLA V22.S4, V16.S4, V2.S4
	VFMLA V23.S4, V16.S4, V3.S4
	VLD1R.P 4(R6), [V16.S4]
	VLD1.P (R7)(R3), [V20.S4, V21.S4, V22.S4, V23.S4]
	VFMLA V20.S4, V16.S4, V4.S4
	VFMLA V21.S4, V16.S4, V5.S4
	VFMLA V22.S4, V16.S4, V6.S4
	VFMLA V23.S4, V16.S4, V7.S4
	VLD1R.P 4(R6), [V16.S4]
	VLD1.P (R7)(R3), [V20.S4, V21.S4, V22.S4, V23.S4]
	VFMLA V20.S4, V16.S4, V8.S4
	VFMLA V21.S4, V16.S4, V9.S4
	VFMLA V22.S4, V16.S4, V10.S4
	VFMLA V23.S4, V16.S4, V11.S4
	VLD1R.P 4(R6), [V16.S4]
	VLD1.P (R7)(R3), [V20.S4, V21.S4, V22.S4, V23.S4]
	VFMLA V20.S4, V16.S4, V12.S4
	VFMLA V21.S4, V16.S4, V13.S4
	VFMLA V22.S4, V16.S4, V14.S4
	VFMLA V23.S4, V16.S4, V15.S4
	SUBS $1, R8, R8
	BNE accum_group
accum_tail:
	CBZ R10, accum_fold
	VLD1R.P 4(R6), [V16.S4]
	VLD1.P (R7)(R3), [V20.S4, V21.S4, V22.S4, V23.S4]
	VFMLA V20.S4, V16.S4, V0.S4
	VFMLA V21.S4, V16.S4, V1.S4
	VFMLA V22.S4, V16.S4, V2.S4
	VFMLA V23.S4, V16.S4, V3.S4
	CMP $1, R10
	BEQ accum_fold
	VLD1R.P 4(R6), [V16.S4]
	VLD1.P (R7)(R3), [V20.S4, V21.S4, V22.S4, V23.S4]
	VFMLA V20.S4, V16.S4, V4.S4
	VFMLA V21.S4, V16.S4, V5.S4
	VFMLA V22.S4, V16.S4, V6.S4
	VFMLA V23.S4, V16.S4, V7.S4
	CMP $2, R10
	BEQ accum_fold
	VLD1R.P 4(R6), [V16.S4]
	VLD1.P (R7)(R3), [V20.S4, V21.S4, V22.S4, V23.S4]
	VFMLA V20.S4, V16.S4, V8.S4
	VFMLA V21.S4, V16.S4, V9.S4
	VFMLA V22.S4, V16.S4, V10.S4
	VFMLA V23.S4, V16.S4, V11.S4
accum_fold:
	WORD $0x4e24d400 // FADD V0.4S, V0.4S, V4.4S
	WORD $0x4e2cd508 // FADD V8.4S, V8.4S, V12.4S
	WORD $0x4e28d400 // FADD V0.4S, V0.4S, V8.4S
	WORD $0x4e25d421 // FADD V1.4S, V1.4S, V5.4S
	WORD $0x4e2dd529 // FADD V9.4S, V9.4S, V13.4S
	WORD $0x4e29d421 // FADD V1.4S, V1.4S, V9.4S
	WORD $0x4e26d442 // FADD V2.4S, V2.4S, V6.4S
	WORD $0x4e2ed54a // FADD V10.4S, V10.4S, V14.4S
	WORD $0x4e2ad442 // FADD V2.4S, V2.4S, V10.4S
	WORD $0x4e27d463 // FADD V3.4S, V3.4S, V7.4S
	WORD $0x4e2fd56b // FADD V11.4S, V11.4S, V15.4S
	WORD $0x4e2bd463 // FADD V3.4S, V3.4S, V11.4S
	VLD1 (R0), [V20.S4, V21.S4, V22.S4, V23.S4]
	WORD $0x4e20d694 // FADD V20.4S, V20.4S, V0.4S
	WORD $0x4e21d6b5 // FADD V21.4S, V21.4S, V1.4S
	WORD $0x4e22d6d6 // FADD V22.4S, V22.4S, V2.4S
	WORD $0x4e23d6f7 // FADD V23.4S, V23.4S, V3.4S
	VST1.P [V20.S4, V21.S4, V22.S4, V23.S4], 64(R0)
	ADD $64, R2, R2
	SUBS $1, R5, R5
	BNE accum_block
	RET

// func sumSquaresNEON(x unsafe.Pointer, blocks int, acc *[16]float64)
//
// acc[j] = Σ x[16b+j]² over blocks×16 elements, in float64 from +0 (each square exact, so the
// fused form is the same sum): partials 2q, 2q+1 in Vq.
TEXT ·sumSquaresNEON(SB), NOSPLIT, $0-24
	MOVD x+0(FP), R0
	MOVD blocks+8(FP), R1
	MOVD acc+16(FP), R2
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16
	VEOR V4.B16, V4.B16, V4.B16
	VEOR V5.B16, V5.B16, V5.B16
	VEOR V6.B16, V6.B16, V6.B16
	VEOR V7.B16, V7.B16, V7.B16
sumsq_block:
	VLD1.P 64(R0), [V16.S4, V17.S4, V18.S4, V19.S4]
	WORD $0x0e617a14 // FCVTL V20.2D, V16.2S
	WORD $0x4e617a15 // FCVTL2 V21.2D, V16.4S
	WORD $0x0e617a36 // FCVTL V22.2D, V17.2S
	WORD $0x4e617a37 // FCVTL2 V23.2D, V17.4S
	WORD $0x0e617a58 // FCVTL V24.2D, V18.2S
	WORD $0x4e617a59 // FCVTL2 V25.2D, V18.4S
	WORD $0x0e617a7a // FCVTL V26.2D, V19.2S
	WORD $0x4e617a7b // FCVTL2 V27.2D, V19.4S
	VFMLA V20.D2, V20.D2, V0.D2
	VFMLA V21.D2, V21.D2, V1.D2
	VFMLA V22.D2, V22.D2, V2.D2
	VFMLA V23.D2, V23.D2, V3.D2
	VFMLA V24.D2, V24.D2, V4.D2
	VFMLA V25.D2, V25.D2, V5.D2
	VFMLA V26.D2, V26.D2, V6.D2
	VFMLA V27.D2, V27.D2, V7.D2
	SUBS $1, R1, R1
	BNE sumsq_block
	VST1.P [V0.D2, V1.D2, V2.D2, V3.D2], 64(R2)
	VST1 [V4.D2, V5.D2, V6.D2, V7.D2], (R2)
	RET

// func scaleMulNEON(dst, x, gain unsafe.Pointer, blocks int, s float32)
//
// dst[i] = (x[i]·s)·gain[i] for i < blocks×16, two float32 roundings.
TEXT ·scaleMulNEON(SB), NOSPLIT, $0-36
	MOVD dst+0(FP), R0
	MOVD x+8(FP), R1
	MOVD gain+16(FP), R2
	MOVD blocks+24(FP), R3
	FMOVS s+32(FP), F30
	VDUP V30.S[0], V30.S4
scale_block:
	VLD1.P 64(R1), [V0.S4, V1.S4, V2.S4, V3.S4]
	VLD1.P 64(R2), [V4.S4, V5.S4, V6.S4, V7.S4]
	WORD $0x6e3edc00 // FMUL V0.4S, V0.4S, V30.4S
	WORD $0x6e24dc00 // FMUL V0.4S, V0.4S, V4.4S
	WORD $0x6e3edc21 // FMUL V1.4S, V1.4S, V30.4S
	WORD $0x6e25dc21 // FMUL V1.4S, V1.4S, V5.4S
	WORD $0x6e3edc42 // FMUL V2.4S, V2.4S, V30.4S
	WORD $0x6e26dc42 // FMUL V2.4S, V2.4S, V6.4S
	WORD $0x6e3edc63 // FMUL V3.4S, V3.4S, V30.4S
	WORD $0x6e27dc63 // FMUL V3.4S, V3.4S, V7.4S
	VST1.P [V0.S4, V1.S4, V2.S4, V3.S4], 64(R0)
	SUBS $1, R3, R3
	BNE scale_block
	RET
