//go:build arm64 && !purego

package kernels

// buildMode is what KernelBuild reports: the arm64 build's Go assembly (NEON).
const buildMode = "assembly"
