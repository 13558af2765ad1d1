package pipeline

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// GenerateFunc is the SDK call a Fleet generator makes; *sdk.Client's Generate is one.
type GenerateFunc func(ctx context.Context, req sdk.GenerateRequest) (*sdk.GenerateResult, error)

// Fleet generates single-turn groups on a Rollout fleet through the SDK's Generate.
type Fleet struct {
	// Call is the SDK call (client.Generate).
	Call GenerateFunc
	// Sampling is every request's sampling. A Seed makes group g's samples use seeds
	// Seed+g*N, Seed+g*N+1, ...
	Sampling sdk.SamplingParams
	// PerSample sends each sample of a group as its own request, so that each is scored as
	// soon as it finishes; the requests share the prompt's routing affinity, so the prompt
	// is prefilled once and found in the prefix cache by the others. Otherwise a group is
	// one request of N samples, which returns when its longest sample ends.
	PerSample bool
	// CacheSalt partitions the servers' prefix cache.
	CacheSalt string
}

// Generate implements Generator.
func (f Fleet) Generate(ctx context.Context, req Request, emit func(int, Trajectory)) error {
	if f.Call == nil {
		return fmt.Errorf("%w: Fleet.Call is nil", ErrInvalid)
	}
	seed := func(i int) *int64 {
		if f.Sampling.Seed == nil {
			return nil
		}
		s := *f.Sampling.Seed + int64(req.Group)*int64(req.N) + int64(i)
		return &s
	}
	id := "pipe-g" + strconv.FormatUint(req.Group, 10)
	if !f.PerSample {
		sp := f.Sampling
		sp.Seed = seed(0)
		res, err := f.Call(ctx, sdk.GenerateRequest{PromptTokenIDs: req.Prompt.TokenIDs, N: req.N, Sampling: sp,
			MinVersion: req.MinVersion, CacheSalt: f.CacheSalt, RequestID: id + "-" + protocol.NewID()[:12]})
		if err != nil {
			return err
		}
		if len(res.Samples) != req.N {
			return fmt.Errorf("generate returned %d samples for n=%d", len(res.Samples), req.N)
		}
		for i, s := range res.Samples {
			emit(i, FromSample(s))
		}
		return nil
	}
	var wg sync.WaitGroup
	errs := make([]error, req.N)
	suffix := protocol.NewID()[:12]
	for i := range req.N {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sp := f.Sampling
			sp.Seed = seed(i)
			res, err := f.Call(ctx, sdk.GenerateRequest{PromptTokenIDs: req.Prompt.TokenIDs, N: 1, Sampling: sp,
				MinVersion: req.MinVersion, CacheSalt: f.CacheSalt, RequestID: id + "-" + suffix + "-" + strconv.Itoa(i)})
			if err != nil {
				errs[i] = err
				return
			}
			if len(res.Samples) != 1 {
				errs[i] = fmt.Errorf("generate returned %d samples for n=1", len(res.Samples))
				return
			}
			emit(i, FromSample(res.Samples[0]))
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// FromSample converts an SDK sample (every token the model's) to a Trajectory.
func FromSample(s sdk.Sample) Trajectory {
	t := Trajectory{Completion: s.TokenIDs(), Logprobs: s.Logprobs(), Versions: s.WeightVersions(),
		FinishReason: s.FinishReason}
	return t
}

// FromSession converts a session's trajectory (sdk.Session.Trajectory: model and environment
// tokens with the loss mask) to a Trajectory; finish is the last turn's finish reason.
func FromSession(t sdk.Trajectory, finish sdk.FinishReason) Trajectory {
	lps := make([]float64, len(t.Logprobs))
	for i, lp := range t.Logprobs {
		lps[i] = float64(lp)
	}
	return Trajectory{Completion: t.Completion, Logprobs: lps, Versions: t.Versions, LossMask: t.LossMask, FinishReason: finish}
}
