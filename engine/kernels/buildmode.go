package kernels

// KernelBuild names the kernel family this binary was built with: "assembly" (the amd64 and
// arm64 default), "archsimd, GOEXPERIMENT=simd", "portable, purego" or "portable" (other
// architectures). KernelName says which of its kernels this CPU runs.
func KernelBuild() string { return buildMode }

// KernelSummary is KernelName with KernelBuild, as `rollout version` and `rollout bench` print
// it: "avx512 (assembly)", "avx2 (archsimd, GOEXPERIMENT=simd)", "generic (portable, purego)".
func KernelSummary() string { return KernelName() + " (" + buildMode + ")" }
