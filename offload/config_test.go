package offload_test

import (
	"testing"

	"github.com/stretchr/testify/require"

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
		{"Delay", func(c *offload.Config) { c.Delay = -1 }},
		{"BandwidthBytesPerSec", func(c *offload.Config) { c.BandwidthBytesPerSec = -1 }},
		{"BlockBytes", func(c *offload.Config) { c.BlockBytes = -1 }},
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
