//go:build amd64 && !purego

#include "textflag.h"

// func prefetchRows(p *float32, rs, n, lines int)
// PREFETCHT0 of lines 64-byte lines from each of n rows rs bytes apart, starting at p. A
// prefetch never faults, but PrefetchRows has checked the rows against the slice anyway.
TEXT ·prefetchRows(SB), NOSPLIT, $0-32
	MOVQ p+0(FP), SI
	MOVQ rs+8(FP), R8
	MOVQ n+16(FP), CX
	MOVQ lines+24(FP), DX
	SHLQ $6, DX
prefetch_row:
	XORQ AX, AX
prefetch_line:
	PREFETCHT0 (SI)(AX*1)
	ADDQ $64, AX
	CMPQ AX, DX
	JLT prefetch_line
	ADDQ R8, SI
	DECQ CX
	JNZ prefetch_row
	RET
