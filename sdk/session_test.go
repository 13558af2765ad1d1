package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/toolcall"
)

// serverOf returns the index of the fake server that answered request id.
func serverOf(t *testing.T, gens []*fakeGen, id string) int {
	t.Helper()
	for i, g := range gens {
		for _, r := range g.got() {
			if r.RequestID == id {
				return i
			}
		}
	}
	t.Fatalf("no server got %s", id)
	return -1
}

func TestSessionTurnsAppendTokenIDs(t *testing.T) {
	_, gens, c := genFleet(t, 1, 3)
	s, err := c.NewSession([]int{7, 7}, SessionOptions{ID: "s", Sampling: SamplingParams{MaxTokens: 3}})
	require.NoError(t, err)
	t0, err := s.Generate(t.Context(), TurnOptions{})
	require.NoError(t, err)
	assert.Equal(t, 0, t0.Index)
	assert.Equal(t, 2, t0.PromptTokens)
	assert.Equal(t, []int{2, 3, 4}, t0.Sample.TokenIDs())
	require.NoError(t, s.Append(100, 101))
	t1, err := s.Generate(t.Context(), TurnOptions{Sampling: &SamplingParams{MaxTokens: 2}})
	require.NoError(t, err)
	assert.Equal(t, 1, t1.Index)
	reqs := gens[0].got()
	require.Len(t, reqs, 2)
	// Turn 1's prompt is the exact ids of everything before it: nothing re-tokenized.
	assert.Equal(t, []int{7, 7, 2, 3, 4, 100, 101}, reqs[1].PromptTokenIDs)
	assert.Equal(t, "s-t1", reqs[1].RequestID)
	assert.Equal(t, 2, reqs[1].Sampling.MaxTokens)
	assert.Equal(t, []int{7, 7, 2, 3, 4, 100, 101, 7, 8}, s.Transcript())

	tr := s.Trajectory()
	assert.Equal(t, []int{7, 7}, tr.Prompt)
	assert.Equal(t, []int{2, 3, 4, 100, 101, 7, 8}, tr.Completion)
	assert.Equal(t, []uint8{1, 1, 1, 0, 0, 1, 1}, tr.LossMask)
	assert.Equal(t, []int64{3, 3, 3, 0, 0, 3, 3}, tr.Versions)
	assert.Equal(t, []float32{-0.5, -0.5, -0.5, 0, 0, -0.5, -0.5}, tr.Logprobs)
	assert.Equal(t, 5, tr.ModelTokens)
	toks := s.Tokens()
	assert.Equal(t, SourceEnv, toks[3].Source)
	assert.Equal(t, 1, toks[3].Turn)
	assert.Equal(t, 2, s.Turns())
}

// TestSessionAffinity checks that sessions sharing a whole prompt stick to one server each
// turn and still spread over the fleet by their keys; plain Generate calls of that prompt
// all go to one server.
func TestSessionAffinity(t *testing.T) {
	_, gens, c := genFleet(t, 4, 0)
	shared := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}
	used := map[int]bool{}
	for k := range 16 {
		id := fmt.Sprintf("sess%d", k)
		s, err := c.NewSession(shared, SessionOptions{ID: id, Sampling: SamplingParams{MaxTokens: 2}})
		require.NoError(t, err)
		home := -1
		for turn := range 3 {
			_, err := s.Generate(t.Context(), TurnOptions{})
			require.NoError(t, err)
			require.NoError(t, s.Append(50))
			got := serverOf(t, gens, fmt.Sprintf("%s-t%d", id, turn))
			if turn == 0 {
				home = got
			}
			require.Equal(t, home, got, "session %s turn %d moved", id, turn)
		}
		used[home] = true
	}
	assert.Greater(t, len(used), 2, "16 sessions with one prompt spread over the fleet")

	// A session's affinity key is not its cache salt: the requests carry no salt.
	for _, g := range gens {
		for _, r := range g.got() {
			assert.Empty(t, r.CacheSalt)
		}
	}
}

func TestSessionContinuesAbortedTurn(t *testing.T) {
	_, gens, c := genFleet(t, 1, 4)
	s, err := c.NewSession([]int{1}, SessionOptions{Sampling: SamplingParams{MaxTokens: 5}})
	require.NoError(t, err)
	gens[0].mu.Lock()
	gens[0].abortAt = 2
	gens[0].mu.Unlock()
	turn, err := s.Generate(t.Context(), TurnOptions{})
	require.NoError(t, err)
	assert.Equal(t, 1, turn.Sample.Continuations)
	assert.Len(t, turn.Sample.Tokens, 5)
	assert.Equal(t, FinishLength, turn.Sample.FinishReason)
	assert.Equal(t, 5, s.Trajectory().ModelTokens)
}

func TestSessionToolCalls(t *testing.T) {
	_, _, c := genFleet(t, 1, 0)
	texts := map[int]string{
		0: `<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>`,
		1: `<tool_call>{"name": "add", "arguments": </tool_call>`,
		2: "The answer is 5.",
	}
	n := 0
	decode := func(_ context.Context, ids []int) (string, error) {
		require.NotEmpty(t, ids)
		s := texts[n]
		n++
		return s, nil
	}
	s, err := c.NewSession([]int{1}, SessionOptions{Sampling: SamplingParams{MaxTokens: 2}, Decode: decode, ToolFormat: toolcall.Hermes})
	require.NoError(t, err)
	t0, err := s.Generate(t.Context(), TurnOptions{})
	require.NoError(t, err)
	require.NoError(t, t0.ToolCallError)
	require.Len(t, t0.ToolCalls, 1)
	assert.Equal(t, "add", t0.ToolCalls[0].Name)
	var args map[string]int
	require.NoError(t, json.Unmarshal(t0.ToolCalls[0].Arguments, &args))
	assert.Equal(t, map[string]int{"a": 2, "b": 3}, args)
	t1, err := s.Generate(t.Context(), TurnOptions{})
	require.NoError(t, err)
	require.ErrorIs(t, t1.ToolCallError, toolcall.ErrMalformed)
	assert.Empty(t, t1.ToolCalls)
	assert.Equal(t, texts[1], t1.Content)
	t2, err := s.Generate(t.Context(), TurnOptions{})
	require.NoError(t, err)
	require.NoError(t, t2.ToolCallError)
	assert.Empty(t, t2.ToolCalls)
	assert.Equal(t, "The answer is 5.", t2.Content)

	failing, err := c.NewSession([]int{1}, SessionOptions{Decode: func(context.Context, []int) (string, error) {
		return "", fmt.Errorf("no tokenizer")
	}})
	require.NoError(t, err)
	_, err = failing.Generate(t.Context(), TurnOptions{})
	require.ErrorContains(t, err, "no tokenizer")
	assert.Empty(t, failing.Transcript()[1:], "a failed turn leaves the transcript unchanged")
}

func TestSessionRejectsBadInput(t *testing.T) {
	_, _, c := genFleet(t, 1, 0)
	_, err := c.NewSession(nil, SessionOptions{})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = c.NewSession([]int{-1}, SessionOptions{})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = c.NewSession([]int{1}, SessionOptions{MinVersion: -1})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = c.NewSession([]int{1}, SessionOptions{ToolFormat: "xml"})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = c.NewSession([]int{1}, SessionOptions{Sampling: SamplingParams{TopP: 3}})
	require.ErrorIs(t, err, ErrInvalid)
	s, err := c.NewSession([]int{1}, SessionOptions{})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(s.ID(), "sess-"))
	require.Equal(t, s.ID(), s.AffinityKey())
	require.ErrorIs(t, s.Append(3, -2), ErrInvalid)
	require.NoError(t, s.Append())
	require.Equal(t, []int{1}, s.Transcript())
	_, err = s.Generate(t.Context(), TurnOptions{Sampling: &SamplingParams{Temperature: -1}})
	require.ErrorIs(t, err, ErrInvalid)
}

func TestTokenizeRejectsBadInput(t *testing.T) {
	_, _, c := genFleet(t, 1, 0)
	for _, req := range []TokenizeRequest{
		{},
		{Text: "a", Messages: []ChatMessage{{Role: "user", Content: "b"}}},
		{Text: "a", Tools: []Tool{{Type: "function", Function: ToolFunction{Name: "f"}}}},
	} {
		_, err := c.Tokenize(t.Context(), req)
		require.ErrorIs(t, err, ErrInvalid)
	}
	_, err := c.Detokenize(t.Context(), []int{1, -1})
	require.ErrorIs(t, err, ErrInvalid)
	// The fake servers have no /tokenize: their 400 is the input's fault, not a reason to
	// move on.
	_, err = c.Tokenize(t.Context(), TokenizeRequest{Text: "a"})
	require.ErrorIs(t, err, ErrRejected)
}

// TestSessionRejectedTurnLeavesTranscript: a turn the server refuses (a 400: say the
// transcript outgrew the context) is ErrRejected and changes nothing; the next turn runs.
func TestSessionRejectedTurnLeavesTranscript(t *testing.T) {
	_, gens, c := genFleet(t, 1, 0)
	s, err := c.NewSession([]int{4, 4}, SessionOptions{Sampling: SamplingParams{MaxTokens: 2}})
	require.NoError(t, err)
	gens[0].mu.Lock()
	gens[0].status = 400
	gens[0].mu.Unlock()
	_, err = s.Generate(t.Context(), TurnOptions{})
	require.ErrorIs(t, err, ErrRejected)
	assert.Equal(t, []int{4, 4}, s.Transcript())
	assert.Zero(t, s.Turns())
	gens[0].mu.Lock()
	gens[0].status = 0
	gens[0].mu.Unlock()
	turn, err := s.Generate(t.Context(), TurnOptions{})
	require.NoError(t, err)
	assert.Equal(t, 0, turn.Index)
	assert.Equal(t, []int{4, 4, 2, 3}, s.Transcript())
}

// TestSessionsSharingAKey: sessions given one affinity key (a GRPO group's episodes) all go to
// that key's server, turn after turn.
func TestSessionsSharingAKey(t *testing.T) {
	_, gens, c := genFleet(t, 4, 0)
	for g := range 4 {
		key := fmt.Sprintf("group-%d", g)
		home := -1
		for k := range 4 {
			id := fmt.Sprintf("%s-ep%d", key, k)
			s, err := c.NewSession([]int{1, 2, 3}, SessionOptions{ID: id, AffinityKey: key, Sampling: SamplingParams{MaxTokens: 2}})
			require.NoError(t, err)
			require.Equal(t, key, s.AffinityKey())
			for turn := range 2 {
				_, err := s.Generate(t.Context(), TurnOptions{})
				require.NoError(t, err)
				got := serverOf(t, gens, fmt.Sprintf("%s-t%d", id, turn))
				if home < 0 {
					home = got
				}
				require.Equal(t, home, got, "%s turn %d left its group's server", id, turn)
			}
		}
	}
}

// TestTurnTextDropsTheStopToken: the stop token that ended a turn (an end-of-turn marker) is
// not part of the text parsed for tool calls; a turn cut by length keeps every token.
func TestTurnTextDropsTheStopToken(t *testing.T) {
	smp := Sample{Tokens: []Token{{ID: 5}, {ID: 6}, {ID: 99}}, FinishReason: FinishStop}
	assert.Equal(t, []int{5, 6}, textIDs(smp, []int{99}))
	assert.Equal(t, []int{5, 6, 99}, textIDs(smp, []int{7}), "ended on EOS, which decodes to nothing")
	smp.FinishReason = FinishLength
	assert.Equal(t, []int{5, 6, 99}, textIDs(smp, []int{99}))
	assert.Empty(t, textIDs(Sample{FinishReason: FinishStop}, []int{99}))
}
