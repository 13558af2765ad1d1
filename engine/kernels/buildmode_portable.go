//go:build !purego && !amd64 && !arm64

package kernels

// buildMode is what KernelBuild reports: this architecture has no assembly kernels.
const buildMode = "portable"
