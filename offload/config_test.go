package offload_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/offload"
)

// TestConfigValidateNamesField: every refused Config names its field after the sentinel.
func TestConfigValidateNamesField(t *testing.T) {
	ok := offload.Config{CPUBytes: 1 << 20, BlockSize: 16}
	require.NoError(t, ok.Validate())
	for _, tc := range []struct {
		field string
		mut   func(*offload.Config)
	}{
		{"BlockSize", func(c *offload.Config) { c.BlockSize = 0 }},
		{"BlocksPerChunk", func(c *offload.Config) { c.BlocksPerChunk = -1 }},
		{"CPUBytes", func(c *offload.Config) { c.CPUBytes = 0 }},
		{"CPUBytes", func(c *offload.Config) { c.BlockBytes = 2 << 20 }},
		{"Policy", func(c *offload.Config) { c.Policy = "fifo" }},
		{"Test.Delay", func(c *offload.Config) { c.Test = &offload.TestHooks{Delay: -1} }},
		{"Test.BandwidthBytesPerSec", func(c *offload.Config) { c.Test = &offload.TestHooks{BandwidthBytesPerSec: -1} }},
		{"BlockBytes", func(c *offload.Config) { c.BlockBytes = -1 }},
		// Issue 25: tokens per chunk wrapped around to 0 and engine.New divided by zero.
		{"BlocksPerChunk", func(c *offload.Config) { c.BlocksPerChunk = 1 << 60 }},
		{"BlocksPerChunk", func(c *offload.Config) { c.BlocksPerChunk = math.MaxInt32 + 1 }},
		{"BlocksPerChunk", func(c *offload.Config) { c.BlockSize, c.BlocksPerChunk = 1<<40, 1<<30 }},
		{"BlocksPerChunk", func(c *offload.Config) { c.BlockBytes, c.BlocksPerChunk = 1<<40, 1<<30 }},
	} {
		c := ok
		tc.mut(&c)
		err := c.Validate()
		require.ErrorIs(t, err, offload.ErrInvalidConfig, tc.field)
		require.ErrorContains(t, err, "offload: invalid config: "+tc.field+": ")
		_, err = offload.New(c)
		require.ErrorIs(t, err, offload.ErrInvalidConfig, tc.field)
	}
}

// TestOverflowingChunkIsAnError: a BlocksPerChunk whose chunk in bytes wraps around to 0
// (2^51 blocks of the tiny model's 8 KiB) used to pass offload.New and then divide by zero in
// engine.New, which binds the pool; it is refused with an error naming the field.
func TestOverflowingChunkIsAnError(t *testing.T) {
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	require.Equal(t, int64(8192), w.Config.KVBlockBytes(16), "2^51 blocks of it are 2^64 bytes")
	conn, err := offload.New(offload.Config{CPUBytes: 1 << 20, BlockSize: 16, BlocksPerChunk: 1 << 51})
	if err == nil {
		var e *engine.Engine
		e, err = engine.New(engine.Config{Weights: w, NumBlocks: 64, Connector: conn.Scheduler(), ConnectorWorker: conn.Worker()})
		if err == nil {
			require.NoError(t, e.Close())
		}
	}
	require.ErrorIs(t, err, offload.ErrInvalidConfig)
	require.ErrorContains(t, err, "BlocksPerChunk: ")
}
