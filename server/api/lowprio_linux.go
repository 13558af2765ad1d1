package api

import (
	"runtime"
	"syscall"
)

// lowPriority moves the calling goroutine to a thread of its own at the lowest CPU priority
// (nice 19), for background work that must not slow serving. The goroutine must not call
// runtime.UnlockOSThread: when it returns, the runtime ends the thread instead of reusing it
// at that priority.
func lowPriority() {
	runtime.LockOSThread()
	// On Linux a thread id names one thread for setpriority; failure only loses the nicety.
	_ = syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), 19)
}
