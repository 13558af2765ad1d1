//go:build purego

package kernels

// buildMode is what KernelBuild reports: the purego tag forces the portable kernels.
const buildMode = "portable, purego"
