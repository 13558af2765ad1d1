package bench

import (
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"golang.org/x/sys/cpu"
)

func TestCPUModelReadsTheFirstProcessor(t *testing.T) {
	const text = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n\nprocessor\t: 1\nmodel name\t: other\n"
	assert.Equal(t, "AMD EPYC (family 25, model 1)", cpuModel(strings.NewReader(text)))
	assert.Equal(t, "Neoverse", cpuModel(strings.NewReader("model name\t: Neoverse\n")), "no family or model: the name alone")
	assert.Empty(t, cpuModel(strings.NewReader("processor\t: 0\nCPU part\t: 0xd0c\n")), "arm64 Linux has no model name")
}

func TestDescribeCPUNamesTheDispatchFeatures(t *testing.T) {
	c := DescribeCPU()
	assert.Equal(t, runtime.NumCPU(), c.Threads)
	if runtime.GOARCH == "amd64" {
		assert.Equal(t, cpu.X86.HasAVX2, slices.Contains(c.Features, "avx2"))
		assert.Equal(t, cpu.X86.HasAVX512F, slices.Contains(c.Features, "avx512f"))
	}
	assert.Contains(t, c.String(), strings.Join(c.Features, " "))
}

func TestTHPMode(t *testing.T) {
	for in, want := range map[string]string{
		"always [madvise] never\n": "madvise",
		"[always] madvise never\n": "always",
		"always madvise [never]":   "never",
		"always madvise never":     "",
		"[broken":                  "",
		"":                         "",
	} {
		assert.Equal(t, want, thpMode(in), "%q", in)
	}
	c := CPUInfo{Model: "X", Threads: 2, Features: []string{"avx2"}, HugePages: "madvise"}
	assert.Equal(t, "X, 2 threads: avx2; transparent huge pages: madvise", c.String())
	c.HugePages = ""
	assert.Equal(t, "X, 2 threads: avx2", c.String())
}
