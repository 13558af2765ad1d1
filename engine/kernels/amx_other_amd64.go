//go:build !linux && !purego

package kernels

// requestAMX reports false: the AMX tile runs on Linux only, where this process can ask for
// the tiles (requestAMX in amx_linux_amd64.go).
func requestAMX() bool { return false }
