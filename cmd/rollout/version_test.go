package main

import (
	"encoding/json"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/cpu"

	"github.com/rolloutkit/rollout/engine/kernels"
)

func TestNewVersionInfo(t *testing.T) {
	stamped := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/rolloutkit/rollout", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc123"},
			{Key: "vcs.modified", Value: "true"},
			{Key: "GOEXPERIMENT", Value: "simd"},
		},
	}
	tests := []struct {
		name              string
		ldVersion, ldComm string
		bi                *debug.BuildInfo
		wantVersion       string
		wantCommit        string
		wantModified      bool
	}{
		{"ldflags win", "v1.2.3", "deadbeef", stamped, "v1.2.3", "deadbeef", true},
		{"build info fallback", "", "", stamped, "v0.3.0", "abc123", true},
		{"devel build", "", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel", "unknown", false},
		{"no build info", "", "", nil, "devel", "unknown", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := newVersionInfo(tt.ldVersion, tt.ldComm, tt.bi)
			assert.Equal(t, tt.wantVersion, v.Version)
			assert.Equal(t, tt.wantCommit, v.Commit)
			assert.Equal(t, tt.wantModified, v.Modified)
			assert.NotEmpty(t, v.GoVersion)
			assert.Equal(t, runtime.GOOS+"/"+runtime.GOARCH, v.Platform)
			assert.NotEmpty(t, v.GOEXPERIMENT)
		})
	}
	assert.Equal(t, "simd", newVersionInfo("", "", stamped).GOEXPERIMENT)
}

func TestSIMDStateMatchesBuild(t *testing.T) {
	v := newVersionInfo("", "", nil)
	if simdExperiment {
		assert.True(t, strings.HasPrefix(v.SIMD, "on"), v.SIMD)
		assert.Equal(t, "simd", v.GOEXPERIMENT)
		assert.Equal(t, "archsimd, GOEXPERIMENT=simd", v.KernelBuild)
	} else {
		assert.True(t, strings.HasPrefix(v.SIMD, "off"), v.SIMD)
		assert.NotContains(t, v.KernelBuild, "archsimd")
	}
	assert.Contains(t, []string{"avx512", "avx2", "generic", "neon"}, v.Kernel)
	if runtime.GOARCH == "amd64" && !strings.HasPrefix(v.KernelBuild, "portable") && cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		assert.NotEqual(t, "generic", v.Kernel, "an amd64 assembly or archsimd build on a CPU with AVX2+FMA runs its SIMD kernels")
	}
}

func TestVersionCommand(t *testing.T) {
	out, _, err := execute(t, NewRootCmd(), "version")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 6, out)
	assert.True(t, strings.HasPrefix(lines[0], "rollout "), lines[0])
	assert.Contains(t, out, "go:           "+runtime.Version())
	assert.Contains(t, out, "simd:         ")
	assert.Contains(t, out, "goexperiment: ")
	assert.Contains(t, out, "kernels:      "+kernels.KernelSummary()+"\n")

	out, _, err = execute(t, NewRootCmd(), "version", "--json")
	require.NoError(t, err)
	var v versionInfo
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	assert.Equal(t, runtime.Version(), v.GoVersion)
	assert.NotEmpty(t, v.Version)
	assert.NotEmpty(t, v.Commit)
	assert.NotEmpty(t, v.SIMD)
	assert.Equal(t, kernels.KernelName(), v.Kernel)
	assert.Equal(t, kernels.KernelBuild(), v.KernelBuild)

	_, _, err = execute(t, NewRootCmd(), "version", "extra")
	require.Error(t, err)
}

func TestVersionJSONFromEnv(t *testing.T) {
	root := newRootCmd(func(k string) (string, bool) {
		if k == "ROLLOUT_JSON" {
			return "1", true
		}
		return "", false
	})
	out, _, err := execute(t, root, "version")
	require.NoError(t, err)
	assert.True(t, json.Valid([]byte(out)), out)
}
