//go:build amd64 && !goexperiment.simd && !purego

package kernels

import "golang.org/x/sys/cpu"

// The CPU features the assembly kernels need, read once at start-up. x/sys/cpu also checks
// that the OS saves the wider registers (XCR0), so a feature reported here is usable.
var (
	// hasAVX2FMA selects the 256-bit kernels.
	hasAVX2FMA = cpu.X86.HasAVX && cpu.X86.HasAVX2 && cpu.X86.HasFMA
	// hasAVX512 selects the 512-bit kernels: the subsets every AVX-512 server CPU has.
	hasAVX512 = hasAVX2FMA && cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512DQ && cpu.X86.HasAVX512VL
)
