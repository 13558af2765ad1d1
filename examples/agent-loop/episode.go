package main

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/pipeline"
)

// episodes is the pipeline's Generator: each sample of a group is one multi-turn episode on
// its own sdk.Session (token ids in and out, every turn routed to the session's server, so
// turn 2 finds turn 1's KV in that server's prefix cache).
type episodes struct {
	c    *sdk.Client
	tk   *task
	samp sdk.SamplingParams // the training sampling (temperature, top-p); MaxTokens per turn is the task's
	seed uint64             // with the group and sample index, fixes each turn's random stream
}

// Generate implements pipeline.Generator.
func (e episodes) Generate(ctx context.Context, req pipeline.Request, emit func(int, pipeline.Trajectory)) error {
	p, ok := req.Prompt.Task.(problem)
	if !ok {
		return fmt.Errorf("prompt task %T is not a problem", req.Prompt.Task)
	}
	errs := make([]error, req.N)
	var wg sync.WaitGroup
	for i := range req.N {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seed := int64(e.seed<<32 ^ req.Group<<8 ^ uint64(i))
			tr, _, err := e.episode(ctx, p, req.MinVersion, e.samp, &seed)
			if err != nil {
				errs[i] = err
				return
			}
			emit(i, tr)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// episode runs one episode of p: the call turn, the tool, the answer turn. seed may be nil
// (greedy evaluation needs none).
func (e episodes) episode(ctx context.Context, p problem, minVersion int64, samp sdk.SamplingParams, seed *int64) (pipeline.Trajectory, outcome, error) {
	first := samp
	first.MaxTokens, first.Seed = callTokens, seed
	s, err := e.c.NewSession(p.Prompt, sdk.SessionOptions{Sampling: first, MinVersion: minVersion})
	if err != nil {
		return pipeline.Trajectory{}, outcome{}, err
	}
	t1, err := s.Generate(ctx, sdk.TurnOptions{})
	if err != nil {
		return pipeline.Trajectory{}, outcome{}, err
	}
	call := t1.Sample.TokenIDs()
	finish := t1.Sample.FinishReason
	var answer []int
	if key, ok := e.tk.parseCall(call); ok {
		if err := s.Append(e.tk.toolResult(key)...); err != nil {
			return pipeline.Trajectory{}, outcome{}, err
		}
		second := samp
		second.MaxTokens = answerTokens
		if seed != nil {
			s2 := *seed + 1<<40
			second.Seed = &s2
		}
		t2, err := s.Generate(ctx, sdk.TurnOptions{Sampling: &second})
		if err != nil {
			return pipeline.Trajectory{}, outcome{}, err
		}
		answer, finish = t2.Sample.TokenIDs(), t2.Sample.FinishReason
	}
	return pipeline.FromSession(s.Trajectory(), finish), e.tk.score(p, call, answer), nil
}

// modelTurns splits a trajectory's completion into its model turns: the runs of tokens the
// loss mask marks as the model's.
func modelTurns(t pipeline.Trajectory) [][]int {
	var turns [][]int
	in := false
	for j, id := range t.Completion {
		model := t.LossMask == nil || t.LossMask[j] == 1
		switch {
		case model && !in:
			turns = append(turns, []int{id})
		case model:
			turns[len(turns)-1] = append(turns[len(turns)-1], id)
		}
		in = model
	}
	return turns
}

// verifier scores an episode from its trajectory alone: the model turns (split by the loss
// mask) are the call and the answer.
func verifier(tk *task) pipeline.Verifier {
	return pipeline.VerifierFunc(func(_ context.Context, pr pipeline.Prompt, t pipeline.Trajectory) (float64, error) {
		p, ok := pr.Task.(problem)
		if !ok {
			return 0, fmt.Errorf("prompt task %T is not a problem", pr.Task)
		}
		turns := modelTurns(t)
		if len(turns) == 0 || len(turns) > 2 {
			return 0, fmt.Errorf("episode of %s has %d model turns", p.Text, len(turns))
		}
		var second []int
		if len(turns) == 2 {
			second = turns[1]
		}
		return tk.score(p, turns[0], second).reward(), nil
	})
}
