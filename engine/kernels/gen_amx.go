//go:build ignore

// gen_amx.go writes w8a8_amx_amd64.s, the AMX tiles of the W8A8 kernel, and their Go
// declarations, w8a8_amx_decl_amd64.go: go run gen_amx.go.
// Go's assembler has no AMX instructions, so they are written out as bytes (VEX encodings
// from Intel's SDM), each beside its mnemonic.
package main

import (
	"bytes"
	"fmt"
	"go/format"
	"os"
)

const (
	blockBytes = 544 // w8a8BlockBytes
	scaleBytes = 32  // w8a8ScaleBytes
	maxTokens  = 16  // w8a8AMXTokens: at most 16 rows in the A and C tiles
	minTokens  = 1   // the narrowest tile written: the tests run every width, the driver from w8a8AMXMin
	cBytes     = maxTokens * 64
)

var b bytes.Buffer

func emit(format string, args ...any) { fmt.Fprintf(&b, "\t"+format+"\n", args...) }

// Hardware numbers of the general registers the encodings name.
const (
	rAX = 0
	rDX = 2
	rBX = 3
	rSI = 6
	rDI = 7
	r8  = 8
)

// vex emits a VEX.128.0F38.W0 instruction: opcode op, prefix pp (0 none, 1 66, 2 F3, 3 F2),
// ModRM reg field reg, VEX.vvvv vvvv, and rm: a tile register (mem nil) or a memory operand.
func vex(mnemonic string, pp, op byte, reg, vvvv int, rm int, mem *memOp) {
	x, bb := 0, 0
	var tail []byte
	var modrm byte
	if mem == nil {
		modrm = 0xC0 | byte(reg&7)<<3 | byte(rm&7)
	} else {
		mod := byte(0)
		switch {
		case mem.disp == 0 && mem.base&7 != 5:
		case mem.disp >= -128 && mem.disp <= 127:
			mod = 1
		default:
			mod = 2
		}
		bb = mem.base >> 3
		if mem.index < 0 { // [base], no SIB (base is not SP or R12 here)
			modrm = mod<<6 | byte(reg&7)<<3 | byte(mem.base&7)
		} else {
			x = mem.index >> 3
			modrm = mod<<6 | byte(reg&7)<<3 | 4
			tail = append(tail, byte(mem.index&7)<<3|byte(mem.base&7)) // scale 1
		}
		switch mod {
		case 1:
			tail = append(tail, byte(int8(mem.disp)))
		case 2:
			d := uint32(int32(mem.disp))
			tail = append(tail, byte(d), byte(d>>8), byte(d>>16), byte(d>>24))
		}
	}
	b1 := byte(0x02) | 0x80 // R̄ (tile registers 0-7)
	if x == 0 {
		b1 |= 0x40
	}
	if bb == 0 {
		b1 |= 0x20
	}
	b2 := byte(^vvvv&0xF)<<3 | pp
	enc := append([]byte{0xC4, b1, b2, op, modrm}, tail...)
	var s bytes.Buffer
	for i, c := range enc {
		if i > 0 {
			s.WriteString("; ")
		}
		fmt.Fprintf(&s, "BYTE $0x%02x", c)
	}
	emit("%s // %s", s.String(), mnemonic)
}

// memOp is a memory operand [base + index*1 + disp] (index -1: none), by hardware numbers.
type memOp struct{ base, index, disp int }

// String is the operand in GNU Intel syntax, as the comments write it (TestAMXByteEncodings
// assembles the comments).
func (m memOp) String() string {
	names := []string{"rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"}
	s := names[m.base]
	if m.index >= 0 {
		s += "+" + names[m.index] + "*1"
	}
	if m.disp != 0 {
		s += fmt.Sprintf("%+d", m.disp)
	}
	return "[" + s + "]"
}

func ldtilecfg(m memOp)        { vex("ldtilecfg "+m.String(), 0, 0x49, 0, 0, 0, &m) }
func tileLoad(t int, m memOp)  { vex(fmt.Sprintf("tileloadd tmm%d, %s", t, m), 3, 0x4B, t, 0, 0, &m) }
func tileStore(t int, m memOp) { vex(fmt.Sprintf("tilestored %s, tmm%d", m, t), 2, 0x4B, t, 0, 0, &m) }
func tileZero(t int)           { vex(fmt.Sprintf("tilezero tmm%d", t), 3, 0x49, t, 0, 0, nil) }
func tdpbssd(c, a, bt int) {
	vex(fmt.Sprintf("tdpbssd tmm%d, tmm%d, tmm%d", c, a, bt), 3, 0x5E, c, bt, a, nil)
}

// out is token t's outputs, y in R9 with R10, R11, R12 and R13 holding 1, 3, 5 and 7 strides
// between tokens, and R15 = y + 8 strides for tokens 8-15.
func out(t int) string {
	base := "R9"
	if t >= 8 {
		base, t = "R15", t-8
	}
	return "(" + base + ")" + []string{"", "(R10*1)", "(R10*2)", "(R11*1)", "(R10*4)", "(R12*1)", "(R11*2)", "(R13*1)"}[t]
}

// Two sets of tiles take turns, so that the tile unit can sum one block while the vector units
// add the last one into the accumulators: set k is C tile k, A tile 2+k, B tile 4+k and the
// k-th buffer. Tiles are not renamed, so a block's sums must go to another tile while the
// last block's are read. More sets did not help: on a 2-vCPU Xeon at 64 tokens, 2, 3 and 4
// sets gave 847-872, 780-805 and 827-877 GOP/s. There the tile instructions and the adding
// barely overlap: summing alone ran at 1200-1300 GOP/s, adding alone at 2200.

// tmul sums the next block in set k: the M tokens' 32 inputs times the panel's 16 rows × 32
// weights, exact int32s, stored to the buffer; then the inputs (DI) and weights (SI) move on
// a block.
func tmul(M, k int) {
	for l := range (blockBytes + 63) / 64 {
		emit("PREFETCHT0 %d(SI)", prefetchAhead+64*l)
	}
	labels++
	emit("TESTQ R14, R14")
	emit("JEQ amx_near%d", labels)
	for l := range (blockBytes + 63) / 64 {
		emit("PREFETCHT1 %d(SI)", prefetchFar+64*l)
	}
	fmt.Fprintf(&b, "amx_near%d:\n", labels)
	tileZero(k)
	tileLoad(2+k, memOp{rDI, r8, 0}) // R8 = 32: the group's inputs are packed by block
	tileLoad(4+k, memOp{rSI, rAX, scaleBytes})
	tdpbssd(k, 2+k, 4+k)
	tileStore(k, memOp{rDX, rAX, k * cBytes})
	emit("ADDQ $%d, SI", blockBytes)
	emit("ADDQ $%d, DI", M*32)
}

// post adds set k's block into the float32 accumulators Z0 to Z(M-1) (token t in Zt): acc =
// fma(float32(isum), ws·xs, acc), as every W8A8 tile does; then the scales (BX for the
// weights', R9 for the inputs', packed by block) move on a block.
func post(M, k int) {
	emit("VCVTPH2PS (BX), Z16") // the 16 rows' float16 scales, widened exactly
	for t := range M {
		i, f := fmt.Sprintf("Z%d", 17+2*(t%3)), fmt.Sprintf("Z%d", 18+2*(t%3))
		emit("VCVTDQ2PS %d(DX), %s", k*cBytes+64*t, i)
		emit("VMULPS.BCST %d(R9), Z16, %s", 4*t, f)
		emit("VFMADD231PS %s, %s, Z%d", f, i, t)
	}
	emit("ADDQ $%d, BX", blockBytes)
	emit("ADDQ $%d, R9", M*4)
}

// prefetchAhead is how far ahead of its block a tile prefetches the weights (PREFETCHT0 of
// each line of the block that far on): four blocks, about the 2 KB of the other batch-1 and
// few-token tiles. The tile unit's loads do not hide DRAM's latency: on a 2-vCPU Xeon, 16
// tokens with W from memory ran at 390-420 GOP/s without it, 450-480 two blocks ahead,
// 470-525 four and 475-515 eight (W in cache, 64 tokens: no change).
const prefetchAhead = 4 * blockBytes

// prefetchFar is how far ahead a tile told to (its far argument) also prefetches the weights
// into L2 (PREFETCHT1): sixteen blocks. The driver tells the first tile over a panel of a token
// block, the one that reads it from memory: on a 2-vCPU Xeon, 16 tokens with W from memory
// went from 510-532 to 557-591 GOP/s (64 tokens with W in cache: no change); in every tile
// it cost 64 tokens 5-8%.
const prefetchFar = 16 * blockBytes

// labels numbers the far-prefetch branches' labels.
var labels int

// tile writes w8a8AMXT<M>, one panel × M tokens, and its tile configuration amxcfg<M>:
// palette 1; C tiles 0-1 M rows × 64 bytes (M tokens × 16 int32), A tiles 2-3 M rows × 32
// bytes (M tokens × a block's 32 int8 inputs), B tiles 4-5 8 rows × 64 bytes (a block's 8
// groups of 4 columns × 16 rows, as packed).
func tile(M int) {
	cfg := fmt.Sprintf("amxcfg%d<>", M)
	fmt.Fprintf(&b, "\nDATA %s+0(SB)/1, $1\n", cfg)
	for i, c := range []int{64, 64, 32, 32, 64, 64} { // Go's assembler takes DATA in increasing offsets
		fmt.Fprintf(&b, "DATA %s+%d(SB)/2, $%d\n", cfg, 16+2*i, c)
	}
	for i, r := range []int{M, M, M, M, 8, 8} {
		fmt.Fprintf(&b, "DATA %s+%d(SB)/1, $%d\n", cfg, 48+i, r)
	}
	fmt.Fprintf(&b, "GLOBL %s(SB), RODATA|NOPTR, $64\n", cfg)

	name := fmt.Sprintf("w8a8AMXT%d", M)
	fmt.Fprintf(&b, "\n// func %s(w unsafe.Pointer, nb int, x unsafe.Pointer, s unsafe.Pointer, y unsafe.Pointer, ys int, buf unsafe.Pointer, far int)\n", name)
	fmt.Fprintf(&b, "TEXT ·%s(SB), NOSPLIT, $0-64\n", name)
	emit("MOVQ w+0(FP), SI")
	emit("MOVQ nb+8(FP), CX")
	emit("MOVQ x+16(FP), DI")
	emit("MOVL $32, R8")
	emit("MOVQ s+24(FP), R9")
	emit("MOVQ buf+48(FP), DX")
	emit("MOVQ far+56(FP), R14")
	emit("MOVL $64, AX")
	for t := range M {
		emit("VPXORD Z%d, Z%d, Z%d", t, t, t)
	}
	emit("TESTQ CX, CX")
	emit("JEQ %s_store", name)
	emit("LEAQ %s(SB), BX", cfg)
	ldtilecfg(memOp{rBX, -1, 0})
	emit("MOVQ SI, BX")
	// Block b is summed in set b%2 while block b-1 is added.
	tmul(M, 0)
	fmt.Fprintf(&b, "%s_loop:\n", name)
	emit("DECQ CX")
	emit("JEQ %s_last0", name)
	tmul(M, 1)
	post(M, 0)
	emit("DECQ CX")
	emit("JEQ %s_last1", name)
	tmul(M, 0)
	post(M, 1)
	emit("JMP %s_loop", name)
	fmt.Fprintf(&b, "%s_last0:\n", name)
	post(M, 0)
	emit("JMP %s_release", name)
	fmt.Fprintf(&b, "%s_last1:\n", name)
	post(M, 1)
	fmt.Fprintf(&b, "%s_release:\n", name)
	vex("tilerelease", 0, 0x49, 0, 0, 0, nil)
	fmt.Fprintf(&b, "%s_store:\n", name)
	emit("MOVQ y+32(FP), R9")
	emit("MOVQ ys+40(FP), R10")
	emit("LEAQ (R10)(R10*2), R11")
	emit("LEAQ (R10)(R10*4), R12")
	emit("LEAQ (R10)(R11*2), R13")
	emit("LEAQ (R9)(R10*8), R15")
	for t := range M {
		emit("VMOVUPS Z%d, %s", t, out(t))
	}
	emit("VZEROUPPER")
	emit("RET")
}

func main() {
	b.WriteString("// Code generated by gen_amx.go; DO NOT EDIT.\n\n//go:build amd64 && !purego\n\n#include \"textflag.h\"\n")
	for M := minTokens; M <= maxTokens; M++ {
		tile(M)
	}
	write("w8a8_amx_amd64.s")
	b.WriteString("// Code generated by gen_amx.go; DO NOT EDIT.\n\n//go:build amd64 && !purego\n\npackage kernels\n\nimport \"unsafe\"\n")
	for M := minTokens; M <= maxTokens; M++ {
		fmt.Fprintf(&b, "\n// w8a8AMXT%d is the AMX tile of one panel × %d tokens; see w8a8_amx_amd64.go.\n//\n//go:noescape\n", M, M)
		fmt.Fprintf(&b, "func w8a8AMXT%d(w unsafe.Pointer, nb int, x unsafe.Pointer, s unsafe.Pointer, y unsafe.Pointer, ys int, buf unsafe.Pointer, far int)\n", M)
	}
	// A switch of direct calls, not a table: through a func value the compiler cannot see
	// that the tiles keep no pointer, and the caller's scratch would move to the heap.
	b.WriteString("\n// w8a8AMX runs the AMX tile of one panel × M tokens, 1 ≤ M ≤ 16 (see w8a8_amx_amd64.go).\n")
	b.WriteString("func w8a8AMX(M int, w unsafe.Pointer, nb int, x unsafe.Pointer, s unsafe.Pointer, y unsafe.Pointer, ys int, buf unsafe.Pointer, far int) {\n\tswitch M {\n")
	for M := minTokens; M <= maxTokens; M++ {
		fmt.Fprintf(&b, "\tcase %d:\n\t\tw8a8AMXT%d(w, nb, x, s, y, ys, buf, far)\n", M, M)
	}
	b.WriteString("\tdefault:\n\t\tpanic(\"kernels: no AMX tile of that width\")\n\t}\n}\n")
	src, err := format.Source(b.Bytes())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	b.Reset()
	b.Write(src)
	write("w8a8_amx_decl_amd64.go")
}

func write(name string) {
	if err := os.WriteFile(name, b.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	b.Reset()
}
