//go:build amd64

#include "textflag.h"

// func copyCRC32C3(dst, src unsafe.Pointer, n, third int) (a, b, c uint32)
//
// Copies n bytes (a multiple of 4) from src to dst and returns the CRC-32C (crc32.Update(0,
// Castagnoli, ·) values) of the three parts [0,third), [third,2·third) and [2·third,n), where
// third is a multiple of 64 and 3·third <= n. One iteration copies a cache line of each part
// and feeds each part's own CRC32 chain: three independent chains hide the instruction's
// latency, and all of it runs while the lines' loads and stores wait on memory.
TEXT ·copyCRC32C3(SB), NOSPLIT, $0-44
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), R10
	MOVQ third+24(FP), DX
	LEAQ (DX)(DX*1), R8
	MOVL $0xffffffff, AX
	MOVL $0xffffffff, BX
	MOVL $0xffffffff, R9
	MOVQ DX, CX
	SHRQ $6, CX
	JZ   tail

loop:
	MOVOU  0(SI), X0
	MOVOU  16(SI), X1
	MOVOU  32(SI), X2
	MOVOU  48(SI), X3
	MOVOU  0(SI)(DX*1), X4
	MOVOU  16(SI)(DX*1), X5
	MOVOU  32(SI)(DX*1), X6
	MOVOU  48(SI)(DX*1), X7
	MOVOU  0(SI)(R8*1), X8
	MOVOU  16(SI)(R8*1), X9
	MOVOU  32(SI)(R8*1), X10
	MOVOU  48(SI)(R8*1), X11
	MOVOU  X0, 0(DI)
	MOVOU  X1, 16(DI)
	MOVOU  X2, 32(DI)
	MOVOU  X3, 48(DI)
	MOVOU  X4, 0(DI)(DX*1)
	MOVOU  X5, 16(DI)(DX*1)
	MOVOU  X6, 32(DI)(DX*1)
	MOVOU  X7, 48(DI)(DX*1)
	MOVOU  X8, 0(DI)(R8*1)
	MOVOU  X9, 16(DI)(R8*1)
	MOVOU  X10, 32(DI)(R8*1)
	MOVOU  X11, 48(DI)(R8*1)
	CRC32Q 0(SI), AX
	CRC32Q 0(SI)(DX*1), BX
	CRC32Q 0(SI)(R8*1), R9
	CRC32Q 8(SI), AX
	CRC32Q 8(SI)(DX*1), BX
	CRC32Q 8(SI)(R8*1), R9
	CRC32Q 16(SI), AX
	CRC32Q 16(SI)(DX*1), BX
	CRC32Q 16(SI)(R8*1), R9
	CRC32Q 24(SI), AX
	CRC32Q 24(SI)(DX*1), BX
	CRC32Q 24(SI)(R8*1), R9
	CRC32Q 32(SI), AX
	CRC32Q 32(SI)(DX*1), BX
	CRC32Q 32(SI)(R8*1), R9
	CRC32Q 40(SI), AX
	CRC32Q 40(SI)(DX*1), BX
	CRC32Q 40(SI)(R8*1), R9
	CRC32Q 48(SI), AX
	CRC32Q 48(SI)(DX*1), BX
	CRC32Q 48(SI)(R8*1), R9
	CRC32Q 56(SI), AX
	CRC32Q 56(SI)(DX*1), BX
	CRC32Q 56(SI)(R8*1), R9
	ADDQ   $64, SI
	ADDQ   $64, DI
	DECQ   CX
	JNZ    loop

tail:
	// The rest of the third part, n - 3·third bytes, starts 2·third past SI.
	LEAQ (DX)(DX*2), R11
	SUBQ R11, R10
	ADDQ R8, SI
	ADDQ R8, DI

tail8:
	CMPQ   R10, $8
	JB     tail4
	MOVQ   (SI), R11
	MOVQ   R11, (DI)
	CRC32Q R11, R9
	ADDQ   $8, SI
	ADDQ   $8, DI
	SUBQ   $8, R10
	JMP    tail8

tail4:
	CMPQ   R10, $4
	JB     done
	MOVL   (SI), R11
	MOVL   R11, (DI)
	CRC32L R11, R9

done:
	NOTL AX
	NOTL BX
	NOTL R9
	MOVL AX, a+32(FP)
	MOVL BX, b+36(FP)
	MOVL R9, c+40(FP)
	RET
