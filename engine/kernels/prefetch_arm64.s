//go:build arm64 && !purego

#include "textflag.h"

// func prefetchRows(p *float32, rs, n, lines int)
// PRFM PLDL1KEEP of lines 64-byte lines from each of n rows rs bytes apart, starting at p.
TEXT ·prefetchRows(SB), NOSPLIT, $0-32
	MOVD p+0(FP), R0
	MOVD rs+8(FP), R1
	MOVD n+16(FP), R2
	MOVD lines+24(FP), R3
	LSL $6, R3, R3
prefetch_row:
	MOVD $0, R4
prefetch_line:
	ADD R4, R0, R5
	PRFM (R5), PLDL1KEEP
	ADD $64, R4, R4
	CMP R3, R4
	BLT prefetch_line
	ADD R1, R0, R0
	SUBS $1, R2, R2
	BNE prefetch_row
	RET
