//go:build purego || !(amd64 || arm64)

package kernels

// simdImpls is empty: this build has only the portable kernel.
func simdImpls() []impl { return nil }

// lowSIMDImpls lists the kernels reading bf16 or int8 directly that this CPU can run.
func lowSIMDImpls() []impl { return nil }
