//go:build amd64 && !goexperiment.simd && !purego

#include "textflag.h"

// func streamRead512(p unsafe.Pointer, blocks int, out *[16]uint32)
// Sums blocks×512 bytes at p as uint32 lanes into out: eight independent accumulators, one
// 64-byte load each per block. Integer adds, because float adds of arbitrary bits could take
// denormal assists.
TEXT ·streamRead512(SB), NOSPLIT, $0-24
	MOVQ p+0(FP), SI
	MOVQ blocks+8(FP), CX
	MOVQ out+16(FP), DX
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	TESTQ CX, CX
	JLE done512

loop512:
	VPADDD (SI), Z0, Z0
	VPADDD 64(SI), Z1, Z1
	VPADDD 128(SI), Z2, Z2
	VPADDD 192(SI), Z3, Z3
	VPADDD 256(SI), Z4, Z4
	VPADDD 320(SI), Z5, Z5
	VPADDD 384(SI), Z6, Z6
	VPADDD 448(SI), Z7, Z7
	ADDQ $512, SI
	DECQ CX
	JNZ loop512

done512:
	VPADDD Z1, Z0, Z0
	VPADDD Z3, Z2, Z2
	VPADDD Z5, Z4, Z4
	VPADDD Z7, Z6, Z6
	VPADDD Z2, Z0, Z0
	VPADDD Z6, Z4, Z4
	VPADDD Z4, Z0, Z0
	VMOVDQU32 Z0, (DX)
	VZEROUPPER
	RET

// func streamRead256(p unsafe.Pointer, blocks int, out *[16]uint32)
// streamRead512 with AVX2 vectors: eight accumulators, two 32-byte loads each per block; the
// lane sums land in out[0:8].
TEXT ·streamRead256(SB), NOSPLIT, $0-24
	MOVQ p+0(FP), SI
	MOVQ blocks+8(FP), CX
	MOVQ out+16(FP), DX
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1
	VPXOR Y2, Y2, Y2
	VPXOR Y3, Y3, Y3
	VPXOR Y4, Y4, Y4
	VPXOR Y5, Y5, Y5
	VPXOR Y6, Y6, Y6
	VPXOR Y7, Y7, Y7
	TESTQ CX, CX
	JLE done256

loop256:
	VPADDD (SI), Y0, Y0
	VPADDD 32(SI), Y1, Y1
	VPADDD 64(SI), Y2, Y2
	VPADDD 96(SI), Y3, Y3
	VPADDD 128(SI), Y4, Y4
	VPADDD 160(SI), Y5, Y5
	VPADDD 192(SI), Y6, Y6
	VPADDD 224(SI), Y7, Y7
	VPADDD 256(SI), Y0, Y0
	VPADDD 288(SI), Y1, Y1
	VPADDD 320(SI), Y2, Y2
	VPADDD 352(SI), Y3, Y3
	VPADDD 384(SI), Y4, Y4
	VPADDD 416(SI), Y5, Y5
	VPADDD 448(SI), Y6, Y6
	VPADDD 480(SI), Y7, Y7
	ADDQ $512, SI
	DECQ CX
	JNZ loop256

done256:
	VPADDD Y1, Y0, Y0
	VPADDD Y3, Y2, Y2
	VPADDD Y5, Y4, Y4
	VPADDD Y7, Y6, Y6
	VPADDD Y2, Y0, Y0
	VPADDD Y6, Y4, Y4
	VPADDD Y4, Y0, Y0
	VMOVDQU Y0, (DX)
	VZEROUPPER
	RET
