//go:build purego || !(amd64 || arm64)

package kernels

// simdImpls is empty: this build has only the portable kernel.
func simdImpls() []impl { return nil }

// lowSIMDImpls lists the kernels reading bf16 or int8 directly that this CPU can run.
func lowSIMDImpls() []impl { return nil }

// w8a8SIMDImpls is empty: this build has only the Go W8A8 kernel.
func w8a8SIMDImpls() []w8a8Impl { return nil }
