//go:build !purego

package kernels

import "syscall"

// Linux's arch_prctl request for permission to use an extended state component, and AMX's
// tile data component (arch/x86/include/uapi/asm/prctl.h, asm/fpu/types.h).
const (
	archReqXCompPerm  = 0x1023
	xfeatureXTileData = 18
)

// requestAMX asks Linux for this process's permission to use the AMX tiles, which Linux
// grants only on request (since 5.16) and refuses where the CPU or a VM's CPU lacks them; an
// AMX instruction without it kills the process with SIGILL.
func requestAMX() bool {
	_, _, errno := syscall.RawSyscall(syscall.SYS_ARCH_PRCTL, archReqXCompPerm, xfeatureXTileData, 0)
	return errno == 0
}
