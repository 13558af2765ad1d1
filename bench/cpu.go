package bench

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/cpu"
)

// CPUInfo names the processor a run measured, so that every report carries its machine:
// figures from machines of one kind still differ by CPU model and vector features.
type CPUInfo struct {
	// Model is /proc/cpuinfo's "model name" on Linux (empty where there is none).
	Model string `json:"model,omitempty"`
	// Features lists the CPU features the kernels and checksums choose between.
	Features []string `json:"features"`
	// Threads is the number of logical CPUs the process may use.
	Threads int `json:"threads"`
	// HugePages is Linux's transparent huge page mode ("always", "madvise" or "never"; empty
	// where unknown): the weights and the KV pool get huge pages under the first two only, and
	// decode is measurably faster with them.
	HugePages string `json:"transparent_hugepages,omitempty"`
}

// DescribeCPU reads the model name and the features of this machine's CPU.
func DescribeCPU() CPUInfo {
	c := CPUInfo{Threads: runtime.NumCPU(), Features: cpuFeatures()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		c.Model = cpuModel(f)
		_ = f.Close()
	}
	if b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err == nil {
		c.HugePages = thpMode(string(b))
	}
	return c
}

// thpMode returns the selected mode of a transparent_hugepage/enabled text, the word in
// brackets ("always [madvise] never" is "madvise"), or "".
func thpMode(s string) string {
	_, rest, ok := strings.Cut(s, "[")
	mode, _, closed := strings.Cut(rest, "]")
	if !ok || !closed {
		return ""
	}
	return mode
}

// String is the one-line form the bench commands print: "AMD EPYC, 2 threads: sse4.2 avx avx2
// fma; transparent huge pages: madvise".
func (c CPUInfo) String() string {
	model := c.Model
	if model == "" {
		model = runtime.GOARCH
	}
	out := fmt.Sprintf("%s, %d threads: %s", model, c.Threads, strings.Join(c.Features, " "))
	if c.HugePages != "" {
		out += "; transparent huge pages: " + c.HugePages
	}
	return out
}

// cpuModel returns the first processor's "model name" of a /proc/cpuinfo text, with its x86
// family and model numbers when given (virtual machines often name only the vendor's line,
// "AMD EPYC", and the numbers tell the generation), or "".
func cpuModel(r io.Reader) string {
	var name, family, model string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" && name != "" {
			break // the end of the first processor's block
		}
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(key) {
		case "model name":
			name = strings.TrimSpace(val)
		case "cpu family":
			family = strings.TrimSpace(val)
		case "model":
			model = strings.TrimSpace(val)
		}
	}
	if name != "" && family != "" && model != "" {
		return fmt.Sprintf("%s (family %s, model %s)", name, family, model)
	}
	return name
}

// cpuFeatures lists the features of this GOARCH that the kernel dispatch and the offload
// checksums test (x/sys/cpu reports a feature only when the OS also saves its registers).
func cpuFeatures() []string {
	var have []string
	add := func(ok bool, name string) {
		if ok {
			have = append(have, name)
		}
	}
	switch runtime.GOARCH {
	case "amd64":
		x := cpu.X86
		add(x.HasSSE42, "sse4.2")
		add(x.HasAVX, "avx")
		add(x.HasAVX2, "avx2")
		add(x.HasFMA, "fma")
		add(x.HasAVX512F, "avx512f")
		add(x.HasAVX512BW, "avx512bw")
		add(x.HasAVX512DQ, "avx512dq")
		add(x.HasAVX512VL, "avx512vl")
		add(x.HasAMXBF16, "amx-bf16")
	case "arm64":
		a := cpu.ARM64
		add(a.HasASIMD, "asimd")
		add(a.HasCRC32, "crc32")
		add(a.HasSHA2, "sha2")
		add(a.HasSVE, "sve")
	}
	return have
}
