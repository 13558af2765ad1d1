package engine

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
)

// TestConfigValidateNamesField: every refused Config names its field after the sentinel, and a
// config of zero values (defaults) with weights is valid.
func TestConfigValidateNamesField(t *testing.T) {
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	require.NoError(t, Config{Weights: w}.Validate())
	for _, tc := range []struct {
		field string
		cfg   Config
	}{
		{"Weights", Config{}},
		{"BlockSize", Config{Weights: w, BlockSize: -1}},
		{"BlockSize", Config{Weights: w, BlockSize: maxBlockSize + 1}},
		{"MaxNumSeqs", Config{Weights: w, MaxNumSeqs: -1}},
		{"MaxBatchedTokens", Config{Weights: w, MaxBatchedTokens: -1}},
		{"MaxQueued", Config{Weights: w, MaxQueued: -1}},
		{"Workers", Config{Weights: w, Workers: -1}},
		{"NumBlocks", Config{Weights: w, NumBlocks: 1}},
		// Issue 25: an overflowing MaxNumSeqs made the derived pool wrap around to 129 blocks,
		// and a huge NumBlocks panicked in the pool's allocation.
		{"MaxNumSeqs", Config{Weights: w, MaxNumSeqs: 1<<59 + 1}},
		{"MaxNumSeqs", Config{Weights: w, MaxNumSeqs: 1 << 62}},
		{"NumBlocks", Config{Weights: w, NumBlocks: 1 << 40}},
		{"NumBlocks", Config{Weights: w, NumBlocks: 1 << 50}},
		{"KVBytes", Config{Weights: w, KVBytes: -1}},
	} {
		err := tc.cfg.Validate()
		require.ErrorIs(t, err, ErrInvalidArgument, tc.field)
		require.ErrorContains(t, err, "engine: invalid argument: "+tc.field+": ")
	}
	// A pool derived from too few bytes is found by New, naming KVBytes.
	_, err = New(Config{Weights: w, KVBytes: 1})
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorContains(t, err, "KVBytes: ")
}

// TestNewRefusesAPoolLargerThanMemory: a KV pool that cannot be allocated (more than the
// machine's memory, or than 32-bit block ids address) is refused with an error naming the
// field that sized it, never a panic or the runtime's fatal out-of-memory error.
func TestNewRefusesAPoolLargerThanMemory(t *testing.T) {
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	for _, tc := range []struct {
		field string
		cfg   Config
	}{
		{"NumBlocks", Config{Weights: w, NumBlocks: maxNumBlocks}}, // 16 TiB of tiny blocks
		{"KVBytes", Config{Weights: w, KVBytes: 1 << 62}},
		{"KVBytes", Config{Weights: w, KVBytes: 1 << 50}},
	} {
		require.NoError(t, tc.cfg.Validate())
		_, err := New(tc.cfg)
		require.ErrorIs(t, err, ErrInvalidArgument, tc.field)
		require.ErrorContains(t, err, "engine: invalid argument: "+tc.field+": ")
	}
	// The largest MaxNumSeqs derives the capped pool, as the documented default does.
	e, err := New(Config{Weights: w, MaxNumSeqs: maxNumSeqs})
	require.NoError(t, err)
	assert.Equal(t, int((1<<30)/w.Config.KVBlockBytes(DefaultBlockSize))+1, e.cfg.NumBlocks)
	require.NoError(t, e.Close())
}
