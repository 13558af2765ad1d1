package engine

import (
	"testing"

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
