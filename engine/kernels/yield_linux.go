package kernels

import "syscall"

// osYield gives this thread's CPU to another runnable thread, if any. runtime.Gosched alone
// only switches goroutines: when the OS runs a spinning worker and the thread it waits for on
// the same CPU (the machine is shared), the spinner would steal the other's time.
func osYield() { _, _, _ = syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
