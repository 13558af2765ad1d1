package sdk_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/server/embedded"
)

// The tests in this file give sessions odd and hostile input on an embedded fleet of real
// servers: each call either works or fails with an error callers can branch on, and a failed
// call leaves the session exactly as it was, ready for the next one.

func hostileFleet(t *testing.T) *sdk.Client {
	t.Helper()
	f, err := embedded.Start(t.Context(), embedded.Options{Servers: 2, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.Close()) })
	do := f.DialOptions()
	do.Logger = slog.New(slog.DiscardHandler)
	c, err := sdk.Dial(t.Context(), do)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// snapshot is what a failed call must leave untouched.
type snapshot struct {
	transcript []int
	tokens     []sdk.SessionToken
	turns      int
}

func snap(s *sdk.Session) snapshot { return snapshot{s.Transcript(), s.Tokens(), s.Turns()} }

func TestSessionHostileInput(t *testing.T) {
	c := hostileFleet(t)
	sampling := sdk.SamplingParams{MaxTokens: 4, IgnoreEOS: true}

	t.Run("token ids", func(t *testing.T) {
		for _, bad := range [][]int{nil, {}, {1, -1}, {math.MinInt}} {
			_, err := c.NewSession(bad, sdk.SessionOptions{Sampling: sampling})
			assert.ErrorIs(t, err, sdk.ErrInvalid, "prompt %v", bad)
		}
		s, err := c.NewSession([]int{1, 2}, sdk.SessionOptions{Sampling: sampling})
		require.NoError(t, err)
		before := snap(s)
		// Append is all or nothing: the good ids before a bad one are not added.
		assert.ErrorIs(t, s.Append(3, 4, -5), sdk.ErrInvalid)
		assert.NoError(t, s.Append(), "an empty append is no step")
		assert.Equal(t, before, snap(s))

		// Ids beyond the model's vocabulary: the SDK does not know the vocabulary, the
		// server refuses the turn, and the transcript is as it was.
		for _, huge := range []int{1 << 20, math.MaxInt32 + 1, math.MaxInt} {
			s, err := c.NewSession([]int{1, huge}, sdk.SessionOptions{Sampling: sampling})
			require.NoError(t, err)
			before := snap(s)
			_, err = s.Generate(t.Context(), sdk.TurnOptions{})
			assert.ErrorIs(t, err, sdk.ErrRejected, "prompt id %d", huge)
			assert.Equal(t, before, snap(s))
		}
		require.NoError(t, s.Append(1<<30))
		before = snap(s)
		_, err = s.Generate(t.Context(), sdk.TurnOptions{})
		require.ErrorIs(t, err, sdk.ErrRejected, "an appended id beyond the vocabulary")
		assert.Contains(t, err.Error(), "1073741824", "the error names the bad id")
		assert.Equal(t, before, snap(s))
	})

	t.Run("turn options", func(t *testing.T) {
		s, err := c.NewSession([]int{1, 2}, sdk.SessionOptions{Sampling: sampling})
		require.NoError(t, err)
		before := snap(s)
		for _, p := range []sdk.SamplingParams{{MaxTokens: -1}, {Temperature: math.NaN()}, {TopP: 2}, {Greedy: true, Temperature: 1}} {
			_, err := s.Generate(t.Context(), sdk.TurnOptions{Sampling: &p})
			assert.ErrorIs(t, err, sdk.ErrInvalid, "%+v", p)
		}
		assert.Equal(t, before, snap(s))
		tr, err := s.Generate(t.Context(), sdk.TurnOptions{})
		require.NoError(t, err)
		assert.Equal(t, 0, tr.Index, "refused turns took no number")
	})

	t.Run("decode fails", func(t *testing.T) {
		var mode atomic.Int32 // 0 works, 1 errors, 2 panics
		decode := func(_ context.Context, ids []int) (string, error) {
			switch mode.Load() {
			case 1:
				return "", errors.New("tokenizer offline")
			case 2:
				panic("id out of the tokenizer's range")
			}
			return "ok", nil
		}
		s, err := c.NewSession([]int{1, 2}, sdk.SessionOptions{Sampling: sampling, Decode: decode})
		require.NoError(t, err)
		before := snap(s)
		mode.Store(1)
		_, err = s.Generate(t.Context(), sdk.TurnOptions{})
		require.ErrorIs(t, err, sdk.ErrDecode)
		assert.Contains(t, err.Error(), "tokenizer offline")
		assert.Equal(t, before, snap(s), "a turn that could not be decoded is not kept")
		mode.Store(2)
		_, err = s.Generate(t.Context(), sdk.TurnOptions{})
		require.ErrorIs(t, err, sdk.ErrDecode, "a panicking Decode is an error, not a crash")
		assert.Contains(t, err.Error(), "id out of the tokenizer's range")
		assert.Equal(t, before, snap(s))
		mode.Store(0)
		tr, err := s.Generate(t.Context(), sdk.TurnOptions{})
		require.NoError(t, err, "the session is usable after both")
		assert.Equal(t, 0, tr.Index)
		assert.Equal(t, "ok", tr.Text)
		assert.Len(t, s.Tokens(), 4)
	})

	t.Run("cancelled turn", func(t *testing.T) {
		s, err := c.NewSession([]int{1, 2}, sdk.SessionOptions{Sampling: sampling})
		require.NoError(t, err)
		before := snap(s)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err = s.Generate(ctx, sdk.TurnOptions{})
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, before, snap(s))
	})

	t.Run("concurrent turns", func(t *testing.T) {
		// Turns of one session called from several goroutines run one at a time, each on
		// the transcript the previous one left: every turn's prompt is the one before it
		// plus that turn's tokens, whatever order they ran in.
		s, err := c.NewSession([]int{1, 2}, sdk.SessionOptions{Sampling: sampling})
		require.NoError(t, err)
		const n = 6
		turns := make([]*sdk.Turn, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				tr, err := s.Generate(t.Context(), sdk.TurnOptions{})
				assert.NoError(t, err)
				turns[i] = tr
			})
		}
		wg.Wait()
		byIndex := make([]*sdk.Turn, n)
		for _, tr := range turns {
			require.NotNil(t, tr)
			require.Nil(t, byIndex[tr.Index], "turn %d ran twice", tr.Index)
			byIndex[tr.Index] = tr
		}
		for k, tr := range byIndex {
			assert.Equal(t, 2+4*k, tr.PromptTokens, "turn %d", k)
		}
		assert.Len(t, s.Transcript(), 2+4*n)
	})
}
