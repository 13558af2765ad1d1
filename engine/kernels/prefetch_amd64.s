//go:build amd64 && !purego

#include "textflag.h"

// func prefetchLines(p unsafe.Pointer, lines int)
// PREFETCHT0 of lines cache lines from p (64 bytes apart).
TEXT ·prefetchLines(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), SI
	MOVQ lines+8(FP), CX
	TESTQ CX, CX
	JLE prefetch_done
prefetch_loop:
	PREFETCHT0 (SI)
	ADDQ $64, SI
	DECQ CX
	JNZ prefetch_loop
prefetch_done:
	RET
