package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/rolloutkit/rollout/sdk"
)

// Errors callers branch on (with errors.Is).
var (
	// ErrInvalid wraps a bad Config or argument.
	ErrInvalid = errors.New("pipeline: invalid argument")
	// ErrVerifierTimeout wraps a verifier call that overran Config.VerifyTimeout.
	ErrVerifierTimeout = errors.New("pipeline: verifier timed out")
	// ErrVerifier wraps an error a verifier returned, or a reward that is not a finite number.
	ErrVerifier = errors.New("pipeline: verifier failed")
	// ErrGenerate wraps a generator's error; it stops the pipeline.
	ErrGenerate = errors.New("pipeline: generation failed")
	// ErrExhausted is returned by Next once the prompt source ended and too few groups are
	// left for a batch.
	ErrExhausted = errors.New("pipeline: prompt source exhausted")
	// ErrNoSignal is returned by Next when more than Config.MaxFiltered groups were dropped
	// for zero reward variance while its batch filled; the pipeline goes on, and the next
	// call counts afresh.
	ErrNoSignal = errors.New("pipeline: groups without reward variance")
	// ErrClosed is returned by Next after Close.
	ErrClosed = errors.New("pipeline: closed")
	// ErrPanic wraps a panic of the caller's Verifier (with ErrVerifier: its sample fails),
	// Generator (with ErrGenerate) or Source: the pipeline recovers it rather than crash
	// the trainer's process over one bad sample.
	ErrPanic = errors.New("pipeline: panic in caller's code")
)

// Prompt is one task instance: the prompt's tokens and whatever the verifier needs to score
// a completion of it (the answer, an environment's seed).
type Prompt struct {
	TokenIDs []int
	// Task is passed to the Generator and the Verifier untouched.
	Task any
}

// Trajectory is one sample of a group: the tokens after the prompt, model tokens and (for a
// multi-turn rollout) environment tokens, with the model tokens' logprobs and weight versions.
type Trajectory struct {
	// Completion holds every token after the prompt, in order.
	Completion []int
	// Logprobs and Versions hold one entry per Completion token; for environment tokens
	// (LossMask 0) they are not read.
	Logprobs []float64
	Versions []int64
	// LossMask is 1 for model tokens and 0 for environment tokens, one per Completion token;
	// nil means every token is a model token (a single-turn sample).
	LossMask []uint8
	// FinishReason is the last model turn's: "stop", "length" or "abort".
	FinishReason sdk.FinishReason
	// Info is the generator's own data about the rollout (turns, tool calls), passed to the
	// verifier and the caller untouched.
	Info any
}

// modelToken reports whether token j is the model's.
func (t *Trajectory) modelToken(j int) bool { return t.LossMask == nil || t.LossMask[j] != 0 }

// VersionRange returns the lowest and highest weight version of the model's tokens; ok is
// false when the trajectory has no model token.
func (t *Trajectory) VersionRange() (lo, hi int64, ok bool) {
	lo, hi = math.MaxInt64, math.MinInt64
	for j, v := range t.Versions {
		if !t.modelToken(j) {
			continue
		}
		lo, hi, ok = min(lo, v), max(hi, v), true
	}
	return lo, hi, ok
}

// ModelTokens counts the model's tokens.
func (t *Trajectory) ModelTokens() int {
	if t.LossMask == nil {
		return len(t.Completion)
	}
	n := 0
	for _, m := range t.LossMask {
		n += int(m)
	}
	return n
}

// Sample is one scored trajectory of a group.
type Sample struct {
	// Group is the group's id; Index the sample's position in it.
	Group uint64
	Index int
	Trajectory
	// Reward is the verifier's score; Err its error (wrapping ErrVerifier or
	// ErrVerifierTimeout), in which case Reward is 0 and the group fails.
	Reward float64
	Err    error
	// VerifyTime is how long the verifier took.
	VerifyTime time.Duration
}

// Group is the samples of one prompt.
type Group struct {
	// ID numbers groups in admission order, from 1.
	ID     uint64
	Prompt Prompt
	// RequestedVersion is the fleet version the group was generated at or above.
	RequestedVersion int64
	// MinVersion and MaxVersion span the model tokens' weight versions: a batch at trainer
	// version T takes the group only if MinVersion >= T-K.
	MinVersion, MaxVersion int64
	Samples                []Sample
	// Err is why the group failed (a verifier error on one of its samples); a failed group
	// is never trained on.
	Err error
	// Filtered reports that dynamic sampling dropped the group: every reward was the same.
	Filtered bool
}

// Rewards returns the samples' rewards.
func (g *Group) Rewards() []float64 {
	out := make([]float64, len(g.Samples))
	for i, s := range g.Samples {
		out[i] = s.Reward
	}
	return out
}

// zeroVariance reports whether every reward of the group is the same: GRPO advantages are
// then all zero and the group carries no signal.
func (g *Group) zeroVariance() bool {
	for _, s := range g.Samples[1:] {
		if s.Reward != g.Samples[0].Reward {
			return false
		}
	}
	return true
}

// Batch is what one trainer step takes.
type Batch struct {
	// Version is the trainer version the batch was assembled for: every group's MinVersion
	// is at least Version-K.
	Version int64
	Groups  []*Group
	// Stale counts groups dropped because no batch could take them within the bound, Filtered
	// groups dynamic sampling removed and Failed groups whose verifier failed (Errors holds
	// their errors), each since the previous batch.
	Stale, Filtered, Failed int
	Errors                  []error
	// Wait is how long Next blocked for the batch.
	Wait time.Duration
}

// Staleness returns, per group, how many versions behind Version its oldest token is.
func (b *Batch) Staleness() []int64 {
	out := make([]int64, len(b.Groups))
	for i, g := range b.Groups {
		out[i] = b.Version - g.MinVersion
	}
	return out
}

// Verifier scores one trajectory. It is called concurrently, each call under its own
// timeout (Config.VerifyTimeout); it must return when ctx ends.
type Verifier interface {
	Verify(ctx context.Context, p Prompt, t Trajectory) (float64, error)
}

// VerifierFunc adapts a function to Verifier.
type VerifierFunc func(ctx context.Context, p Prompt, t Trajectory) (float64, error)

// Verify calls f.
func (f VerifierFunc) Verify(ctx context.Context, p Prompt, t Trajectory) (float64, error) {
	return f(ctx, p, t)
}

// Request asks a Generator for one group.
type Request struct {
	// Group is the group's id (for request ids and logs).
	Group  uint64
	Prompt Prompt
	// N is the number of samples.
	N int
	// MinVersion is the lowest weight version the samples may be generated at: route only to
	// servers at this version or above (sdk.GenerateRequest.MinVersion).
	MinVersion int64
}

// Generator produces the N samples of one group and hands each to emit as it finishes (from
// any goroutine, once per sample index in [0, N)). It returns once every sample is emitted,
// or with an error (which stops the pipeline) when it could not finish.
type Generator interface {
	Generate(ctx context.Context, req Request, emit func(index int, t Trajectory)) error
}

// Source yields prompts; it returns io.EOF when there are no more. It is called from one
// goroutine at a time.
type Source func(ctx context.Context) (Prompt, error)

// check validates a trajectory's shape.
func (t *Trajectory) check() error {
	n := len(t.Completion)
	switch {
	case len(t.Logprobs) != n || len(t.Versions) != n:
		return fmt.Errorf("%d logprobs and %d versions for %d tokens", len(t.Logprobs), len(t.Versions), n)
	case t.LossMask != nil && len(t.LossMask) != n:
		return fmt.Errorf("%d loss-mask entries for %d tokens", len(t.LossMask), n)
	}
	return nil
}
