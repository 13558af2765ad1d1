//go:build amd64 && !goexperiment.simd && !purego

#include "textflag.h"

// The vector kernels of the default amd64 build, in AVX-512 (Z registers, K masks) and AVX2+FMA
// (Y registers). Each computes the canonical definition of the package doc bit for bit: the
// reductions keep 16 lanes (one Z, or two Y, per 16 elements), the exponential is the same
// sequence of float32 roundings as exp32. The Go wrappers in vec_asm_amd64.go handle tails and
// fold the 16 partial sums. Every function ends with VZEROUPPER.
//
// Operand order is Go's: sources reversed, destination last (VSUBPS b, a, d is d = a - b).
// VMAXPS/VMINPS return their Go-first operand when either is NaN.

// vecc holds each constant 8 times (32 bytes), for AVX2 memory operands and AVX-512 broadcasts.
// C_LO: -87, the clamp floor
#define C_LO 0
// C_NEGMAX: -MaxFloat32: v >= it is false for NaN and -Inf
#define C_NEGMAX 32
// C_LOG2E: log2 e
#define C_LOG2E 64
// C_NLN2H: -ln2 high part
#define C_NLN2H 96
// C_NLN2L: -ln2 low part
#define C_NLN2L 128
// C_P0: Cephes expf p0
#define C_P0 160
// C_P1: p1
#define C_P1 192
// C_P2: p2
#define C_P2 224
// C_P3: p3
#define C_P3 256
// C_P4: p4
#define C_P4 288
// C_P5: p5
#define C_P5 320
// C_ONE: 1
#define C_ONE 352
// C_BIAS: float32 exponent bias (int32)
#define C_BIAS 384
// C_SIGN: sign bit
#define C_SIGN 416
// C_NINF: -Inf
#define C_NINF 448
DATA vecc<>+0(SB)/4, $0xc2ae0000
DATA vecc<>+4(SB)/4, $0xc2ae0000
DATA vecc<>+8(SB)/4, $0xc2ae0000
DATA vecc<>+12(SB)/4, $0xc2ae0000
DATA vecc<>+16(SB)/4, $0xc2ae0000
DATA vecc<>+20(SB)/4, $0xc2ae0000
DATA vecc<>+24(SB)/4, $0xc2ae0000
DATA vecc<>+28(SB)/4, $0xc2ae0000
DATA vecc<>+32(SB)/4, $0xff7fffff
DATA vecc<>+36(SB)/4, $0xff7fffff
DATA vecc<>+40(SB)/4, $0xff7fffff
DATA vecc<>+44(SB)/4, $0xff7fffff
DATA vecc<>+48(SB)/4, $0xff7fffff
DATA vecc<>+52(SB)/4, $0xff7fffff
DATA vecc<>+56(SB)/4, $0xff7fffff
DATA vecc<>+60(SB)/4, $0xff7fffff
DATA vecc<>+64(SB)/4, $0x3fb8aa3b
DATA vecc<>+68(SB)/4, $0x3fb8aa3b
DATA vecc<>+72(SB)/4, $0x3fb8aa3b
DATA vecc<>+76(SB)/4, $0x3fb8aa3b
DATA vecc<>+80(SB)/4, $0x3fb8aa3b
DATA vecc<>+84(SB)/4, $0x3fb8aa3b
DATA vecc<>+88(SB)/4, $0x3fb8aa3b
DATA vecc<>+92(SB)/4, $0x3fb8aa3b
DATA vecc<>+96(SB)/4, $0xbf318000
DATA vecc<>+100(SB)/4, $0xbf318000
DATA vecc<>+104(SB)/4, $0xbf318000
DATA vecc<>+108(SB)/4, $0xbf318000
DATA vecc<>+112(SB)/4, $0xbf318000
DATA vecc<>+116(SB)/4, $0xbf318000
DATA vecc<>+120(SB)/4, $0xbf318000
DATA vecc<>+124(SB)/4, $0xbf318000
DATA vecc<>+128(SB)/4, $0x395e8083
DATA vecc<>+132(SB)/4, $0x395e8083
DATA vecc<>+136(SB)/4, $0x395e8083
DATA vecc<>+140(SB)/4, $0x395e8083
DATA vecc<>+144(SB)/4, $0x395e8083
DATA vecc<>+148(SB)/4, $0x395e8083
DATA vecc<>+152(SB)/4, $0x395e8083
DATA vecc<>+156(SB)/4, $0x395e8083
DATA vecc<>+160(SB)/4, $0x39506967
DATA vecc<>+164(SB)/4, $0x39506967
DATA vecc<>+168(SB)/4, $0x39506967
DATA vecc<>+172(SB)/4, $0x39506967
DATA vecc<>+176(SB)/4, $0x39506967
DATA vecc<>+180(SB)/4, $0x39506967
DATA vecc<>+184(SB)/4, $0x39506967
DATA vecc<>+188(SB)/4, $0x39506967
DATA vecc<>+192(SB)/4, $0x3ab743ce
DATA vecc<>+196(SB)/4, $0x3ab743ce
DATA vecc<>+200(SB)/4, $0x3ab743ce
DATA vecc<>+204(SB)/4, $0x3ab743ce
DATA vecc<>+208(SB)/4, $0x3ab743ce
DATA vecc<>+212(SB)/4, $0x3ab743ce
DATA vecc<>+216(SB)/4, $0x3ab743ce
DATA vecc<>+220(SB)/4, $0x3ab743ce
DATA vecc<>+224(SB)/4, $0x3c088908
DATA vecc<>+228(SB)/4, $0x3c088908
DATA vecc<>+232(SB)/4, $0x3c088908
DATA vecc<>+236(SB)/4, $0x3c088908
DATA vecc<>+240(SB)/4, $0x3c088908
DATA vecc<>+244(SB)/4, $0x3c088908
DATA vecc<>+248(SB)/4, $0x3c088908
DATA vecc<>+252(SB)/4, $0x3c088908
DATA vecc<>+256(SB)/4, $0x3d2aa9c1
DATA vecc<>+260(SB)/4, $0x3d2aa9c1
DATA vecc<>+264(SB)/4, $0x3d2aa9c1
DATA vecc<>+268(SB)/4, $0x3d2aa9c1
DATA vecc<>+272(SB)/4, $0x3d2aa9c1
DATA vecc<>+276(SB)/4, $0x3d2aa9c1
DATA vecc<>+280(SB)/4, $0x3d2aa9c1
DATA vecc<>+284(SB)/4, $0x3d2aa9c1
DATA vecc<>+288(SB)/4, $0x3e2aaaaa
DATA vecc<>+292(SB)/4, $0x3e2aaaaa
DATA vecc<>+296(SB)/4, $0x3e2aaaaa
DATA vecc<>+300(SB)/4, $0x3e2aaaaa
DATA vecc<>+304(SB)/4, $0x3e2aaaaa
DATA vecc<>+308(SB)/4, $0x3e2aaaaa
DATA vecc<>+312(SB)/4, $0x3e2aaaaa
DATA vecc<>+316(SB)/4, $0x3e2aaaaa
DATA vecc<>+320(SB)/4, $0x3f000000
DATA vecc<>+324(SB)/4, $0x3f000000
DATA vecc<>+328(SB)/4, $0x3f000000
DATA vecc<>+332(SB)/4, $0x3f000000
DATA vecc<>+336(SB)/4, $0x3f000000
DATA vecc<>+340(SB)/4, $0x3f000000
DATA vecc<>+344(SB)/4, $0x3f000000
DATA vecc<>+348(SB)/4, $0x3f000000
DATA vecc<>+352(SB)/4, $0x3f800000
DATA vecc<>+356(SB)/4, $0x3f800000
DATA vecc<>+360(SB)/4, $0x3f800000
DATA vecc<>+364(SB)/4, $0x3f800000
DATA vecc<>+368(SB)/4, $0x3f800000
DATA vecc<>+372(SB)/4, $0x3f800000
DATA vecc<>+376(SB)/4, $0x3f800000
DATA vecc<>+380(SB)/4, $0x3f800000
DATA vecc<>+384(SB)/4, $0x0000007f
DATA vecc<>+388(SB)/4, $0x0000007f
DATA vecc<>+392(SB)/4, $0x0000007f
DATA vecc<>+396(SB)/4, $0x0000007f
DATA vecc<>+400(SB)/4, $0x0000007f
DATA vecc<>+404(SB)/4, $0x0000007f
DATA vecc<>+408(SB)/4, $0x0000007f
DATA vecc<>+412(SB)/4, $0x0000007f
DATA vecc<>+416(SB)/4, $0x80000000
DATA vecc<>+420(SB)/4, $0x80000000
DATA vecc<>+424(SB)/4, $0x80000000
DATA vecc<>+428(SB)/4, $0x80000000
DATA vecc<>+432(SB)/4, $0x80000000
DATA vecc<>+436(SB)/4, $0x80000000
DATA vecc<>+440(SB)/4, $0x80000000
DATA vecc<>+444(SB)/4, $0x80000000
DATA vecc<>+448(SB)/4, $0xff800000
DATA vecc<>+452(SB)/4, $0xff800000
DATA vecc<>+456(SB)/4, $0xff800000
DATA vecc<>+460(SB)/4, $0xff800000
DATA vecc<>+464(SB)/4, $0xff800000
DATA vecc<>+468(SB)/4, $0xff800000
DATA vecc<>+472(SB)/4, $0xff800000
DATA vecc<>+476(SB)/4, $0xff800000
GLOBL vecc<>(SB), RODATA|NOPTR, $480

// ---- Macros of the attention kernels ----

// ROWPTR sets dst = k + min(s+i, n-1)·rs (the last group of a block repeats its last row).
// R12 = s, R14 = n-1, R8 = rs, BX = k; uses dst only.
#define ROWPTR(i, dst) \
	LEAQ i(R12), dst \
	CMPQ dst, R14 \
	CMOVQGT R14, dst \
	IMULQ R8, dst \
	ADDQ BX, dst

// FOLDROW finishes fold16's first levels for one row in Xa (from Za/Ya): lanes j+8 into j
// (the Y halves, already added), j+4 into j, then the order 0 2 1 3 so that two VHADDPS
// finish (b0+b2)+(b1+b3). Xt is scratch.
#define FOLDROW(Ya, Xa, Xt) \
	VEXTRACTF128 $1, Ya, Xt \
	VADDPS Xt, Xa, Xa \
	VSHUFPS $0xd8, Xa, Xa, Xa

// SCORESTORE: X0 = the four scores; store them at out[s] (DI) or, for the last partial group,
// at tail. CX is scratch.
#define SCORESTORE(tailLabel, nextLabel) \
	VMULPS X6, X0, X0 \
	LEAQ 4(R12), CX \
	CMPQ CX, n+24(FP) \
	JGT tailLabel \
	VMOVUPS X0, (DI)(R12*4) \
	JMP nextLabel \
tailLabel: \
	MOVQ tail+56(FP), CX \
	VMOVUPS X0, (CX) \
nextLabel:

// func clearUpperAsm()
TEXT ·clearUpperAsm(SB), NOSPLIT, $0-0
	VZEROUPPER
	RET

// ---- MaxF32 ----

// func max512asm(p *float32, blocks int, out *[16]float32)
// SI = p, CX = blocks left, DI = out; Z0-Z3 four running maxima (from -Inf), Z4-Z7 loads.
// VMAXPS acc, v, acc keeps acc when v is NaN, so NaN reads as -Inf.
TEXT ·max512asm(SB), NOSPLIT, $0-24
	MOVQ p+0(FP), SI
	MOVQ blocks+8(FP), CX
	MOVQ out+16(FP), DI
	VBROADCASTSS vecc<>+C_NINF(SB), Z0
	VMOVAPS Z0, Z1
	VMOVAPS Z0, Z2
	VMOVAPS Z0, Z3
max512_loop4:
	CMPQ CX, $4
	JLT max512_loop1
	VMOVUPS (SI), Z4
	VMOVUPS 64(SI), Z5
	VMOVUPS 128(SI), Z6
	VMOVUPS 192(SI), Z7
	VMAXPS Z0, Z4, Z0
	VMAXPS Z1, Z5, Z1
	VMAXPS Z2, Z6, Z2
	VMAXPS Z3, Z7, Z3
	ADDQ $256, SI
	SUBQ $4, CX
	JMP max512_loop4
max512_loop1:
	TESTQ CX, CX
	JLE max512_done
	VMOVUPS (SI), Z4
	VMAXPS Z0, Z4, Z0
	ADDQ $64, SI
	DECQ CX
	JMP max512_loop1
max512_done:
	VMAXPS Z1, Z0, Z0
	VMAXPS Z3, Z2, Z2
	VMAXPS Z2, Z0, Z0
	VMOVUPS Z0, (DI)
	VZEROUPPER
	RET

// func max256asm(p *float32, blocks int, out *[16]float32)
// max512asm with two Y vectors per 16-element block: Y0/Y1 (lanes 0-7, 8-15), Y2/Y3 a second
// pair for odd blocks; out gets max(Y0,Y2) and max(Y1,Y3).
TEXT ·max256asm(SB), NOSPLIT, $0-24
	MOVQ p+0(FP), SI
	MOVQ blocks+8(FP), CX
	MOVQ out+16(FP), DI
	VBROADCASTSS vecc<>+C_NINF(SB), Y0
	VMOVAPS Y0, Y1
	VMOVAPS Y0, Y2
	VMOVAPS Y0, Y3
max256_loop2:
	CMPQ CX, $2
	JLT max256_loop1
	VMOVUPS (SI), Y4
	VMOVUPS 32(SI), Y5
	VMOVUPS 64(SI), Y6
	VMOVUPS 96(SI), Y7
	VMAXPS Y0, Y4, Y0
	VMAXPS Y1, Y5, Y1
	VMAXPS Y2, Y6, Y2
	VMAXPS Y3, Y7, Y3
	ADDQ $128, SI
	SUBQ $2, CX
	JMP max256_loop2
max256_loop1:
	TESTQ CX, CX
	JLE max256_done
	VMOVUPS (SI), Y4
	VMOVUPS 32(SI), Y5
	VMAXPS Y0, Y4, Y0
	VMAXPS Y1, Y5, Y1
max256_done:
	VMAXPS Y2, Y0, Y0
	VMAXPS Y3, Y1, Y1
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VZEROUPPER
	RET

// ---- FirstAtLeast ----

// func firstGE512asm(p *float32, blocks int, v float32) int
// Returns the first 16-element block holding an element >= v, or blocks. SI = p, CX = blocks,
// AX = block index, Z1 = v; v <= x (LE_OQ, 0x12) is false for NaN x, like x >= v.
TEXT ·firstGE512asm(SB), NOSPLIT, $0-32
	MOVQ p+0(FP), SI
	MOVQ blocks+8(FP), CX
	VBROADCASTSS v+16(FP), Z1
	XORQ AX, AX
first512_loop:
	CMPQ AX, CX
	JGE first512_done
	VCMPPS $0x12, (SI), Z1, K1
	KORTESTW K1, K1
	JNZ first512_done
	INCQ AX
	ADDQ $64, SI
	JMP first512_loop
first512_done:
	MOVQ AX, ret+24(FP)
	VZEROUPPER
	RET

// func firstGE256asm(p *float32, blocks int, v float32) int
// firstGE512asm with two Y compares per block, OR-ed, tested through their sign masks.
TEXT ·firstGE256asm(SB), NOSPLIT, $0-32
	MOVQ p+0(FP), SI
	MOVQ blocks+8(FP), CX
	VBROADCASTSS v+16(FP), Y1
	XORQ AX, AX
first256_loop:
	CMPQ AX, CX
	JGE first256_done
	VCMPPS $0x12, (SI), Y1, Y2
	VCMPPS $0x12, 32(SI), Y1, Y3
	VORPS Y3, Y2, Y2
	VMOVMSKPS Y2, DX
	TESTL DX, DX
	JNZ first256_done
	INCQ AX
	ADDQ $64, SI
	JMP first256_loop
first256_done:
	MOVQ AX, ret+24(FP)
	VZEROUPPER
	RET

// ---- The canonical exponential ----

// EXP512: Z4 = exp32(clamp(Z0 - shift)), 0 where Z0 is NaN or -Inf.
// In: Z0 = x. Constants: Z16 shift, Z17 -87, Z18 -MaxFloat32, Z19 log2e, Z20 -ln2h, Z21 -ln2l,
// Z22-Z27 p0-p5, Z28 1, Z29 0. Scratch: K1 (valid), Z1 d, Z2 k, Z3 r, Z5 r², Z6 r+1.
// The steps are exp32's: d; k = roundeven(d·log2e) (VRNDSCALEPS imm 0); r = fma(k, -ln2h, d),
// r = fma(k, -ln2l, r); Horner p = fma(p, r, p_i); e = fma(p, r², r+1); e·2^k (VSCALEFPS, exact).
#define EXP512 \
	VCMPPS $0x1d, Z18, Z0, K1 \
	VSUBPS Z16, Z0, Z1 \
	VMAXPS Z17, Z1, Z1 \
	VMINPS Z29, Z1, Z1 \
	VMULPS Z19, Z1, Z2 \
	VRNDSCALEPS $0, Z2, Z2 \
	VMOVAPS Z1, Z3 \
	VFMADD231PS Z20, Z2, Z3 \
	VFMADD231PS Z21, Z2, Z3 \
	VMOVAPS Z22, Z4 \
	VFMADD213PS Z23, Z3, Z4 \
	VFMADD213PS Z24, Z3, Z4 \
	VFMADD213PS Z25, Z3, Z4 \
	VFMADD213PS Z26, Z3, Z4 \
	VFMADD213PS Z27, Z3, Z4 \
	VMULPS Z3, Z3, Z5 \
	VADDPS Z28, Z3, Z6 \
	VFMADD213PS Z6, Z5, Z4 \
	VSCALEFPS Z2, Z4, Z4 \
	VMOVAPS.Z Z4, K1, Z4

// EXPCONST512 loads EXP512's constants; the shift goes to Z16 separately.
#define EXPCONST512 \
	VBROADCASTSS vecc<>+C_LO(SB), Z17 \
	VBROADCASTSS vecc<>+C_NEGMAX(SB), Z18 \
	VBROADCASTSS vecc<>+C_LOG2E(SB), Z19 \
	VBROADCASTSS vecc<>+C_NLN2H(SB), Z20 \
	VBROADCASTSS vecc<>+C_NLN2L(SB), Z21 \
	VBROADCASTSS vecc<>+C_P0(SB), Z22 \
	VBROADCASTSS vecc<>+C_P1(SB), Z23 \
	VBROADCASTSS vecc<>+C_P2(SB), Z24 \
	VBROADCASTSS vecc<>+C_P3(SB), Z25 \
	VBROADCASTSS vecc<>+C_P4(SB), Z26 \
	VBROADCASTSS vecc<>+C_P5(SB), Z27 \
	VBROADCASTSS vecc<>+C_ONE(SB), Z28 \
	VPXORD Z29, Z29, Z29

// EXP256: Y4 = exp32(clamp(Y0 - shift)), 0 where Y0 is NaN or -Inf; EXP512 with AVX2: the
// constants are memory operands, Y15 = shift, Y14 = 0; scratch Y1-Y3, Y5-Y7 (Y7 = valid).
// 2^k is built in the exponent field ((k+127)<<23) and multiplied in, exact as VSCALEFPS.
#define EXP256 \
	VCMPPS $0x1d, vecc<>+C_NEGMAX(SB), Y0, Y7 \
	VSUBPS Y15, Y0, Y1 \
	VMAXPS vecc<>+C_LO(SB), Y1, Y1 \
	VMINPS Y14, Y1, Y1 \
	VMULPS vecc<>+C_LOG2E(SB), Y1, Y2 \
	VROUNDPS $0, Y2, Y2 \
	VMOVAPS Y1, Y3 \
	VFMADD231PS vecc<>+C_NLN2H(SB), Y2, Y3 \
	VFMADD231PS vecc<>+C_NLN2L(SB), Y2, Y3 \
	VMOVUPS vecc<>+C_P0(SB), Y4 \
	VFMADD213PS vecc<>+C_P1(SB), Y3, Y4 \
	VFMADD213PS vecc<>+C_P2(SB), Y3, Y4 \
	VFMADD213PS vecc<>+C_P3(SB), Y3, Y4 \
	VFMADD213PS vecc<>+C_P4(SB), Y3, Y4 \
	VFMADD213PS vecc<>+C_P5(SB), Y3, Y4 \
	VMULPS Y3, Y3, Y5 \
	VADDPS vecc<>+C_ONE(SB), Y3, Y6 \
	VFMADD213PS Y6, Y5, Y4 \
	VCVTPS2DQ Y2, Y2 \
	VPADDD vecc<>+C_BIAS(SB), Y2, Y2 \
	VPSLLD $23, Y2, Y2 \
	VMULPS Y2, Y4, Y4 \
	VANDPS Y7, Y4, Y4

// func exp512asm(x, dst *float32, blocks int, shift float32, acc *[16]float64)
// e_i for blocks×16 floats at x, stored at dst unless it is nil, lane j added in float64 to
// acc[j]. SI = x, DI = dst, CX = blocks, DX = acc; Z14/Z15 = acc[0:8]/acc[8:16]; Z7/Z8 the
// widened halves of e.
TEXT ·exp512asm(SB), NOSPLIT, $0-40
	MOVQ x+0(FP), SI
	MOVQ dst+8(FP), DI
	MOVQ blocks+16(FP), CX
	MOVQ acc+32(FP), DX
	VBROADCASTSS shift+24(FP), Z16
	EXPCONST512
	VMOVUPD (DX), Z14
	VMOVUPD 64(DX), Z15
	TESTQ CX, CX
	JLE exp512_done
exp512_loop:
	VMOVUPS (SI), Z0
	EXP512
	TESTQ DI, DI
	JZ exp512_sum
	VMOVUPS Z4, (DI)
	ADDQ $64, DI
exp512_sum:
	VCVTPS2PD Y4, Z7
	VEXTRACTF64X4 $1, Z4, Y8
	VCVTPS2PD Y8, Z8
	VADDPD Z7, Z14, Z14
	VADDPD Z8, Z15, Z15
	ADDQ $64, SI
	DECQ CX
	JNZ exp512_loop
exp512_done:
	VMOVUPD Z14, (DX)
	VMOVUPD Z15, 64(DX)
	VZEROUPPER
	RET

// func exp256asm(x, dst *float32, blocks int, shift float32, acc *[16]float64)
// exp512asm with AVX2: each block is two Y vectors; Y10-Y13 = acc[0:4], [4:8], [8:12], [12:16].
TEXT ·exp256asm(SB), NOSPLIT, $0-40
	MOVQ x+0(FP), SI
	MOVQ dst+8(FP), DI
	MOVQ blocks+16(FP), CX
	MOVQ acc+32(FP), DX
	VBROADCASTSS shift+24(FP), Y15
	VXORPS Y14, Y14, Y14
	VMOVUPD (DX), Y10
	VMOVUPD 32(DX), Y11
	VMOVUPD 64(DX), Y12
	VMOVUPD 96(DX), Y13
	TESTQ CX, CX
	JLE exp256_done
exp256_loop:
	VMOVUPS (SI), Y0
	EXP256
	TESTQ DI, DI
	JZ exp256_sum0
	VMOVUPS Y4, (DI)
exp256_sum0:
	VCVTPS2PD X4, Y8
	VEXTRACTF128 $1, Y4, X9
	VCVTPS2PD X9, Y9
	VADDPD Y8, Y10, Y10
	VADDPD Y9, Y11, Y11
	VMOVUPS 32(SI), Y0
	EXP256
	TESTQ DI, DI
	JZ exp256_sum1
	VMOVUPS Y4, 32(DI)
	ADDQ $64, DI
exp256_sum1:
	VCVTPS2PD X4, Y8
	VEXTRACTF128 $1, Y4, X9
	VCVTPS2PD X9, Y9
	VADDPD Y8, Y12, Y12
	VADDPD Y9, Y13, Y13
	ADDQ $64, SI
	DECQ CX
	JNZ exp256_loop
exp256_done:
	VMOVUPD Y10, (DX)
	VMOVUPD Y11, 32(DX)
	VMOVUPD Y12, 64(DX)
	VMOVUPD Y13, 96(DX)
	VZEROUPPER
	RET

// ---- SwiGLU ----

// func swiglu512asm(a, gate, up *float32, blocks int)
// a = silu(g)·u for blocks×16 elements: Z10 = x (gate), Z0 = -|x| (sign bit set, Z30), EXP512
// with shift 0 gives e; Z5 = 1+e, Z6 = x/(1+e), Z7 = (x·e)/(1+e), K2 = x >= 0 picks Z6.
TEXT ·swiglu512asm(SB), NOSPLIT, $0-32
	MOVQ a+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), BX
	MOVQ blocks+24(FP), CX
	EXPCONST512
	VPXORD Z16, Z16, Z16
	VBROADCASTSS vecc<>+C_SIGN(SB), Z30
	TESTQ CX, CX
	JLE swiglu512_done
swiglu512_loop:
	VMOVUPS (SI), Z10
	VPORD Z30, Z10, Z0
	EXP512
	VADDPS Z28, Z4, Z5
	VDIVPS Z5, Z10, Z6
	VMULPS Z4, Z10, Z7
	VDIVPS Z5, Z7, Z7
	VCMPPS $0x1d, Z29, Z10, K2
	VMOVAPS Z6, K2, Z7
	VMULPS (BX), Z7, Z7
	VMOVUPS Z7, (DI)
	ADDQ $64, SI
	ADDQ $64, BX
	ADDQ $64, DI
	DECQ CX
	JNZ swiglu512_loop
swiglu512_done:
	VZEROUPPER
	RET

// SWIGLU256 does 8 elements at byte offset off: Y8 = x, Y0 = -|x|, EXP256 (shift Y15 = 0) gives
// e in Y4; Y9 = 1+e, Y10 = x/(1+e), Y11 = (x·e)/(1+e), Y12 = x >= 0 selects Y10 (VBLENDVPS).
#define SWIGLU256(off) \
	VMOVUPS off(SI), Y8 \
	VORPS vecc<>+C_SIGN(SB), Y8, Y0 \
	EXP256 \
	VADDPS vecc<>+C_ONE(SB), Y4, Y9 \
	VDIVPS Y9, Y8, Y10 \
	VMULPS Y4, Y8, Y11 \
	VDIVPS Y9, Y11, Y11 \
	VCMPPS $0x1d, Y14, Y8, Y12 \
	VBLENDVPS Y12, Y10, Y11, Y11 \
	VMULPS off(BX), Y11, Y11 \
	VMOVUPS Y11, off(DI)

// func swiglu256asm(a, gate, up *float32, blocks int)
TEXT ·swiglu256asm(SB), NOSPLIT, $0-32
	MOVQ a+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), BX
	MOVQ blocks+24(FP), CX
	VXORPS Y14, Y14, Y14
	VXORPS Y15, Y15, Y15
	TESTQ CX, CX
	JLE swiglu256_done
swiglu256_loop:
	SWIGLU256(0)
	SWIGLU256(32)
	ADDQ $64, SI
	ADDQ $64, BX
	ADDQ $64, DI
	DECQ CX
	JNZ swiglu256_loop
swiglu256_done:
	VZEROUPPER
	RET

// ---- RMSNorm ----

// func sumsq512asm(x *float32, blocks int, acc *[16]float64)
// acc[j] += x_j² in float64 (the square is exact, so one FMA rounds like the add alone).
// SI = x, CX = blocks, DX = acc; Z14/Z15 = acc[0:8]/acc[8:16], Z0/Z1 the widened halves.
TEXT ·sumsq512asm(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), SI
	MOVQ blocks+8(FP), CX
	MOVQ acc+16(FP), DX
	VMOVUPD (DX), Z14
	VMOVUPD 64(DX), Z15
	TESTQ CX, CX
	JLE sumsq512_done
sumsq512_loop:
	VCVTPS2PD (SI), Z0
	VCVTPS2PD 32(SI), Z1
	VFMADD231PD Z0, Z0, Z14
	VFMADD231PD Z1, Z1, Z15
	ADDQ $64, SI
	DECQ CX
	JNZ sumsq512_loop
sumsq512_done:
	VMOVUPD Z14, (DX)
	VMOVUPD Z15, 64(DX)
	VZEROUPPER
	RET

// func sumsq256asm(x *float32, blocks int, acc *[16]float64)
// sumsq512asm with four Y accumulators Y10-Y13 of four float64 lanes each.
TEXT ·sumsq256asm(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), SI
	MOVQ blocks+8(FP), CX
	MOVQ acc+16(FP), DX
	VMOVUPD (DX), Y10
	VMOVUPD 32(DX), Y11
	VMOVUPD 64(DX), Y12
	VMOVUPD 96(DX), Y13
	TESTQ CX, CX
	JLE sumsq256_done
sumsq256_loop:
	VCVTPS2PD (SI), Y0
	VCVTPS2PD 16(SI), Y1
	VCVTPS2PD 32(SI), Y2
	VCVTPS2PD 48(SI), Y3
	VFMADD231PD Y0, Y0, Y10
	VFMADD231PD Y1, Y1, Y11
	VFMADD231PD Y2, Y2, Y12
	VFMADD231PD Y3, Y3, Y13
	ADDQ $64, SI
	DECQ CX
	JNZ sumsq256_loop
sumsq256_done:
	VMOVUPD Y10, (DX)
	VMOVUPD Y11, 32(DX)
	VMOVUPD Y12, 64(DX)
	VMOVUPD Y13, 96(DX)
	VZEROUPPER
	RET

// func scale512asm(dst, x, w *float32, blocks int, s float32)
// dst = (x·s)·g for blocks×16 elements; Z2 = s.
TEXT ·scale512asm(SB), NOSPLIT, $0-36
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), BX
	MOVQ blocks+24(FP), CX
	VBROADCASTSS s+32(FP), Z2
	TESTQ CX, CX
	JLE scale512_done
scale512_loop:
	VMULPS (SI), Z2, Z0
	VMULPS (BX), Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, BX
	ADDQ $64, DI
	DECQ CX
	JNZ scale512_loop
scale512_done:
	VZEROUPPER
	RET

// func scale256asm(dst, x, w *float32, blocks int, s float32)
TEXT ·scale256asm(SB), NOSPLIT, $0-36
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), BX
	MOVQ blocks+24(FP), CX
	VBROADCASTSS s+32(FP), Y2
	TESTQ CX, CX
	JLE scale256_done
scale256_loop:
	VMULPS (SI), Y2, Y0
	VMULPS 32(SI), Y2, Y1
	VMULPS (BX), Y0, Y0
	VMULPS 32(BX), Y1, Y1
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ $64, SI
	ADDQ $64, BX
	ADDQ $64, DI
	DECQ CX
	JNZ scale256_loop
scale256_done:
	VZEROUPPER
	RET

// ---- Attention ----

// func scores512asm(q, k *float32, rs, n, nch int, scale float32, out, tail *float32)
// scores[s] = scale·dot(q, row s) for s < n, rows rs bytes apart from k, q nch×16 floats; four
// rows at a time. SI = q, BX = k, R8 = rs, R10 = nch·64, DI = out, R12 = s, R14 = n-1,
// R13/R11/AX/DX = the four row pointers, CX = byte offset in the row; Z0-Z3 the rows' 16-lane
// FMA chains, Z4 = q chunk, X5 scratch, X6 = scale.
TEXT ·scores512asm(SB), NOSPLIT, $0-64
	MOVQ q+0(FP), SI
	MOVQ k+8(FP), BX
	MOVQ rs+16(FP), R8
	MOVQ n+24(FP), R14
	DECQ R14
	MOVQ nch+32(FP), R10
	SHLQ $6, R10
	VBROADCASTSS scale+40(FP), X6
	MOVQ out+48(FP), DI
	XORQ R12, R12
scores512_group:
	CMPQ R12, R14
	JGT scores512_done
	ROWPTR(0, R13)
	ROWPTR(1, R11)
	ROWPTR(2, AX)
	ROWPTR(3, DX)
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	XORQ CX, CX
scores512_chunk:
	VMOVUPS (SI)(CX*1), Z4
	VFMADD231PS (R13)(CX*1), Z4, Z0
	VFMADD231PS (R11)(CX*1), Z4, Z1
	VFMADD231PS (AX)(CX*1), Z4, Z2
	VFMADD231PS (DX)(CX*1), Z4, Z3
	ADDQ $64, CX
	CMPQ CX, R10
	JLT scores512_chunk
	VEXTRACTF64X4 $1, Z0, Y5
	VADDPS Y5, Y0, Y0
	VEXTRACTF64X4 $1, Z1, Y5
	VADDPS Y5, Y1, Y1
	VEXTRACTF64X4 $1, Z2, Y5
	VADDPS Y5, Y2, Y2
	VEXTRACTF64X4 $1, Z3, Y5
	VADDPS Y5, Y3, Y3
	FOLDROW(Y0, X0, X5)
	FOLDROW(Y1, X1, X5)
	FOLDROW(Y2, X2, X5)
	FOLDROW(Y3, X3, X5)
	VHADDPS X1, X0, X0
	VHADDPS X3, X2, X2
	VHADDPS X2, X0, X0
	SCORESTORE(scores512_tail, scores512_next)
	ADDQ $4, R12
	JMP scores512_group
scores512_done:
	VZEROUPPER
	RET

// func scores256asm(q, k *float32, rs, n, nch int, scale float32, out, tail *float32)
// scores512asm with AVX2, q nch×8 floats: a row's canonical lanes 0-7 and 8-15 are Y0-Y3 (even
// chunks) and Y4-Y7 (odd chunks), added before the fold; Y8/Y9 = q chunks, X10 scratch.
// R10 = the bytes of whole chunk pairs; an odd last chunk goes to Y0-Y3.
TEXT ·scores256asm(SB), NOSPLIT, $0-64
	MOVQ q+0(FP), SI
	MOVQ k+8(FP), BX
	MOVQ rs+16(FP), R8
	MOVQ n+24(FP), R14
	DECQ R14
	MOVQ nch+32(FP), R10
	SHRQ $1, R10
	SHLQ $6, R10
	VBROADCASTSS scale+40(FP), X6
	MOVQ out+48(FP), DI
	XORQ R12, R12
scores256_group:
	CMPQ R12, R14
	JGT scores256_done
	ROWPTR(0, R13)
	ROWPTR(1, R11)
	ROWPTR(2, AX)
	ROWPTR(3, DX)
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y7, Y7, Y7
	VXORPS Y11, Y11, Y11
	XORQ CX, CX
scores256_pair:
	CMPQ CX, R10
	JGE scores256_odd
	VMOVUPS (SI)(CX*1), Y8
	VMOVUPS 32(SI)(CX*1), Y9
	VFMADD231PS (R13)(CX*1), Y8, Y0
	VFMADD231PS (R11)(CX*1), Y8, Y1
	VFMADD231PS (AX)(CX*1), Y8, Y2
	VFMADD231PS (DX)(CX*1), Y8, Y3
	VFMADD231PS 32(R13)(CX*1), Y9, Y4
	VFMADD231PS 32(R11)(CX*1), Y9, Y5
	VFMADD231PS 32(AX)(CX*1), Y9, Y7
	VFMADD231PS 32(DX)(CX*1), Y9, Y11
	ADDQ $64, CX
	JMP scores256_pair
scores256_odd:
	MOVQ nch+32(FP), R9
	TESTQ $1, R9
	JZ scores256_fold
	VMOVUPS (SI)(CX*1), Y8
	VFMADD231PS (R13)(CX*1), Y8, Y0
	VFMADD231PS (R11)(CX*1), Y8, Y1
	VFMADD231PS (AX)(CX*1), Y8, Y2
	VFMADD231PS (DX)(CX*1), Y8, Y3
scores256_fold:
	VADDPS Y4, Y0, Y0
	VADDPS Y5, Y1, Y1
	VADDPS Y7, Y2, Y2
	VADDPS Y11, Y3, Y3
	FOLDROW(Y0, X0, X10)
	FOLDROW(Y1, X1, X10)
	FOLDROW(Y2, X2, X10)
	FOLDROW(Y3, X3, X10)
	VHADDPS X1, X0, X0
	VHADDPS X3, X2, X2
	VHADDPS X2, X0, X0
	SCORESTORE(scores256_tail, scores256_next)
	ADDQ $4, R12
	JMP scores256_group
scores256_done:
	VZEROUPPER
	RET

// func accum512asm(out, p, v *float32, rs, n, nch int)
// out += Σ_s p[s]·row s, rows rs bytes apart from v, out nch×16 floats: per 16-float chunk
// (byte offset CX), the four chains Z0-Z3 (slot s mod 4), then out + ((a0+a1)+(a2+a3)).
// DI = out, SI = p, BX = v, R8 = rs, R11 = 3·rs, R9 = n, R10 = nch·64, R12 = slot 0's row
// pointer, DX = s, AX = slots left; Z4-Z7 = broadcast weights.
TEXT ·accum512asm(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ p+8(FP), SI
	MOVQ v+16(FP), BX
	MOVQ rs+24(FP), R8
	LEAQ (R8)(R8*2), R11
	MOVQ n+32(FP), R9
	MOVQ nch+40(FP), R10
	SHLQ $6, R10
	XORQ CX, CX
accum512_chunk:
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	LEAQ (BX)(CX*1), R12
	XORQ DX, DX
accum512_slots:
	MOVQ R9, AX
	SUBQ DX, AX
	CMPQ AX, $4
	JLT accum512_rest
	VBROADCASTSS (SI)(DX*4), Z4
	VBROADCASTSS 4(SI)(DX*4), Z5
	VBROADCASTSS 8(SI)(DX*4), Z6
	VBROADCASTSS 12(SI)(DX*4), Z7
	VFMADD231PS (R12), Z4, Z0
	VFMADD231PS (R12)(R8*1), Z5, Z1
	VFMADD231PS (R12)(R8*2), Z6, Z2
	VFMADD231PS (R12)(R11*1), Z7, Z3
	LEAQ (R12)(R8*4), R12
	ADDQ $4, DX
	JMP accum512_slots
accum512_rest:
	TESTQ AX, AX
	JLE accum512_sum
	VBROADCASTSS (SI)(DX*4), Z4
	VFMADD231PS (R12), Z4, Z0
	CMPQ AX, $2
	JLT accum512_sum
	VBROADCASTSS 4(SI)(DX*4), Z5
	VFMADD231PS (R12)(R8*1), Z5, Z1
	CMPQ AX, $3
	JLT accum512_sum
	VBROADCASTSS 8(SI)(DX*4), Z6
	VFMADD231PS (R12)(R8*2), Z6, Z2
accum512_sum:
	VADDPS Z1, Z0, Z0
	VADDPS Z3, Z2, Z2
	VADDPS Z2, Z0, Z0
	VADDPS (DI)(CX*1), Z0, Z0
	VMOVUPS Z0, (DI)(CX*1)
	ADDQ $64, CX
	CMPQ CX, R10
	JLT accum512_chunk
	VZEROUPPER
	RET

// func accum256asm(out, p, v *float32, rs, n, nch int)
// accum512asm with Y vectors: out is nch×8 floats, chunks of 32 bytes.
TEXT ·accum256asm(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ p+8(FP), SI
	MOVQ v+16(FP), BX
	MOVQ rs+24(FP), R8
	LEAQ (R8)(R8*2), R11
	MOVQ n+32(FP), R9
	MOVQ nch+40(FP), R10
	SHLQ $5, R10
	XORQ CX, CX
accum256_chunk:
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	LEAQ (BX)(CX*1), R12
	XORQ DX, DX
accum256_slots:
	MOVQ R9, AX
	SUBQ DX, AX
	CMPQ AX, $4
	JLT accum256_rest
	VBROADCASTSS (SI)(DX*4), Y4
	VBROADCASTSS 4(SI)(DX*4), Y5
	VBROADCASTSS 8(SI)(DX*4), Y6
	VBROADCASTSS 12(SI)(DX*4), Y7
	VFMADD231PS (R12), Y4, Y0
	VFMADD231PS (R12)(R8*1), Y5, Y1
	VFMADD231PS (R12)(R8*2), Y6, Y2
	VFMADD231PS (R12)(R11*1), Y7, Y3
	LEAQ (R12)(R8*4), R12
	ADDQ $4, DX
	JMP accum256_slots
accum256_rest:
	TESTQ AX, AX
	JLE accum256_sum
	VBROADCASTSS (SI)(DX*4), Y4
	VFMADD231PS (R12), Y4, Y0
	CMPQ AX, $2
	JLT accum256_sum
	VBROADCASTSS 4(SI)(DX*4), Y5
	VFMADD231PS (R12)(R8*1), Y5, Y1
	CMPQ AX, $3
	JLT accum256_sum
	VBROADCASTSS 8(SI)(DX*4), Y6
	VFMADD231PS (R12)(R8*2), Y6, Y2
accum256_sum:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VADDPS (DI)(CX*1), Y0, Y0
	VMOVUPS Y0, (DI)(CX*1)
	ADDQ $32, CX
	CMPQ CX, R10
	JLT accum256_chunk
	VZEROUPPER
	RET
