package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
)

func TestUpdateMemoryCheck(t *testing.T) {
	dir := t.TempDir()
	meminfo := filepath.Join(dir, "meminfo")
	write := func(availKB int64) {
		t.Helper()
		s := fmt.Sprintf("MemTotal:       24000000 kB\nMemFree:        1000 kB\nMemAvailable:   %d kB\nBuffers:        0 kB\n", availKB)
		require.NoError(t, os.WriteFile(meminfo, []byte(s), 0o644))
	}
	c, err := model.PresetConfig("llama3.2-1b-shape")
	require.NoError(t, err)
	need := updateMemory(c)
	assert.Greater(t, need, int64(20e9), "five float32 copies of 1.2B weights")

	write(need>>10 - 1)
	err = checkUpdateMemory(c, "llama3.2-1b-shape", meminfo)
	require.ErrorIs(t, err, ErrNotEnoughMemory)
	assert.Contains(t, err.Error(), "llama3.2-1b-shape")

	write(need>>10 + 1)
	require.NoError(t, checkUpdateMemory(c, "llama3.2-1b-shape", meminfo))
	require.NoError(t, checkUpdateMemory(c, "llama3.2-1b-shape", filepath.Join(dir, "absent")), "no meminfo: no check")
	avail, ok := availableMemory(meminfo)
	require.True(t, ok)
	assert.Equal(t, (need>>10+1)<<10, avail)
}
