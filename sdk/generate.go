package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

// DefaultMaxTokens is the sample length when SamplingParams.MaxTokens is 0 (the servers'
// default too).
const DefaultMaxTokens = 16

// DefaultTemperature is the temperature when SamplingParams.Temperature is 0 (vLLM's default).
const DefaultTemperature = 1.0

// GreedyTemperature is the temperature below which the servers decode greedily (vLLM's
// _SAMPLING_EPS).
const GreedyTemperature = 1e-5

// LogprobMode selects the distribution reported logprobs refer to.
type LogprobMode string

const (
	// LogprobProcessed is the log-probability under the distribution the token was sampled
	// from: after temperature and the min-p/top-k/top-p filters, renormalised (-Inf outside the
	// kept set; 0 for greedy tokens). It is the behaviour policy of RL importance ratios: a
	// trainer recomputes it with the same settings (trainer.Config.Sampling). The default.
	LogprobProcessed LogprobMode = "processed"
	// LogprobRaw is log-softmax of the raw logits at temperature 1, before filters: the model's
	// own distribution, whatever the sampling settings.
	LogprobRaw LogprobMode = "raw"
)

// maxRetries bounds how often one request moves to another server after a failure.
const maxRetries = 8

// maxResponseBytes bounds a /generate response the client reads.
const maxResponseBytes = 256 << 20

// SamplingParams configure how tokens are sampled.
type SamplingParams struct {
	// MaxTokens bounds each sample's generated tokens (0: DefaultMaxTokens).
	MaxTokens int `json:"max_tokens"`
	// Temperature scales logits (0: DefaultTemperature, 1.0, as in vLLM). Greedy decoding is
	// Greedy, not a zero temperature.
	Temperature float64 `json:"temperature"`
	// Greedy decodes greedily: the most likely token, ties to the lowest id (Temperature must
	// be 0). N greedy samples of one prompt are N copies of one sample, whose GRPO advantages
	// are all 0: Generate refuses N > 1 with Greedy unless AllowIdenticalSamples is set.
	Greedy bool `json:"-"`
	// AllowIdenticalSamples lets N > 1 go with greedy decoding (Greedy, or a temperature
	// below GreedyTemperature, which the servers decode greedily).
	AllowIdenticalSamples bool `json:"-"`
	// LogprobMode is the distribution each token's Logprob refers to (empty:
	// LogprobProcessed, the distribution sampled from, which makes importance ratios right
	// for any temperature and filters). LogprobRaw is the model's own distribution
	// (temperature 1, no filters): for scoring and evaluation, or RL sampled at temperature
	// 1 without filters, where the two are the same.
	LogprobMode LogprobMode `json:"logprob_mode,omitempty"`
	// TopP keeps the smallest set of tokens whose mass reaches TopP (0 or 1: off).
	TopP float64 `json:"top_p"`
	// TopK keeps the K most likely tokens (0 or -1: off).
	TopK int `json:"top_k"`
	// MinP keeps tokens at least MinP times as likely as the most likely one (0: off).
	MinP float64 `json:"min_p"`
	// Seed fixes the random stream (sample i of a group uses Seed+i); nil lets servers choose.
	Seed *int64 `json:"seed,omitempty"`
	// StopTokenIDs end a sample when generated (besides the model's EOS).
	StopTokenIDs []int `json:"stop_token_ids,omitempty"`
	// Logprobs is how many top logprobs to return per token; each token's own logprob is
	// always returned.
	Logprobs int `json:"logprobs"`
	// IgnoreEOS keeps generating past the model's EOS (fixed-length rollouts).
	IgnoreEOS bool `json:"ignore_eos,omitempty"`
}

// FinishReason says why a sample ended; the constants are the protocol's, which the servers
// use too.
type FinishReason = protocol.FinishReason

// Finish reasons of a Sample.
const (
	// FinishStop: the model produced EOS or a stop token.
	FinishStop = protocol.FinishStop
	// FinishLength: the sample reached MaxTokens.
	FinishLength = protocol.FinishLength
	// FinishAbort: the caller aborted the request (Abort); Generate continues samples the
	// servers aborted for a pause.
	FinishAbort = protocol.FinishAbort
)

// GenerateRequest is one prompt and how many samples of it to generate.
type GenerateRequest struct {
	PromptTokenIDs []int
	// N is the number of samples (a GRPO group; default 1). All N go to one server in one
	// request, so the prompt is prefilled once.
	N        int
	Sampling SamplingParams
	// MinVersion routes only to servers serving at least this weight version.
	MinVersion int64
	// CacheSalt partitions the servers' prefix cache (and the routing affinity).
	CacheSalt string
	// AffinityKey, when set, decides the request's home server instead of the prompt's
	// first block: requests with one key go to one server while the fleet is balanced, and
	// different keys spread over the fleet. Sessions set it so that every turn of an episode
	// lands where the previous turn's KV is cached, whatever system prompt they share.
	AffinityKey string
	// RequestID names the request on the servers (default: a random id); Abort takes it.
	RequestID string

	// pin, when routable and within the load bound, is the server to use before the
	// affinity's home: a session's server, which holds its transcript's KV.
	pin string
}

// Token is one generated token with the weight version that produced it.
type Token struct {
	ID int `json:"id"`
	// Logprob is the token's log-probability (-Inf when outside the processed distribution;
	// null in JSON).
	Logprob       float64 `json:"logprob"`
	WeightVersion int64   `json:"weight_version"`
	// Top holds the most likely tokens at this position when Sampling.Logprobs > 0.
	Top []TokenLogprob `json:"top,omitempty"`
}

// TokenLogprob is one candidate token and its log-probability.
type TokenLogprob struct {
	Token   int     `json:"token"`
	Logprob float64 `json:"logprob"`
}

// Sample is one whole generated sequence.
type Sample struct {
	Tokens []Token `json:"tokens"`
	// FinishReason is FinishStop, FinishLength or FinishAbort (only when the caller
	// aborted it).
	FinishReason FinishReason `json:"finish_reason"`
	// Servers are the servers that generated the sample's tokens, in order (more than one
	// when it was continued elsewhere).
	Servers []string `json:"servers"`
	// Segments are the requests that generated the tokens, in order: one, plus one per
	// continuation.
	Segments []Segment `json:"segments"`
	// Continuations counts how often the sample was resubmitted after a pause aborted it.
	Continuations int `json:"continuations"`
	// NumCachedTokens is the prompt tokens the first server found in its prefix cache.
	NumCachedTokens int `json:"num_cached_tokens"`
}

// TokenIDs returns the sample's token ids.
func (s Sample) TokenIDs() []int {
	out := make([]int, len(s.Tokens))
	for i, t := range s.Tokens {
		out[i] = t.ID
	}
	return out
}

// Logprobs returns the sample's per-token logprobs.
func (s Sample) Logprobs() []float64 {
	out := make([]float64, len(s.Tokens))
	for i, t := range s.Tokens {
		out[i] = t.Logprob
	}
	return out
}

// WeightVersions returns the weight version of every token.
func (s Sample) WeightVersions() []int64 {
	out := make([]int64, len(s.Tokens))
	for i, t := range s.Tokens {
		out[i] = t.WeightVersion
	}
	return out
}

// Segment is one server request's share of a sample: Tokens tokens from Server.
type Segment struct {
	Server string `json:"server"`
	Tokens int    `json:"tokens"`
}

// GenerateResult is every sample of a request and where they were generated.
type GenerateResult struct {
	RequestID string   `json:"request_id"`
	Samples   []Sample `json:"samples"`
	// Servers are the distinct servers that generated any token, in first-use order.
	Servers []string `json:"servers"`
	// Continuations is the total over samples; Retries counts moves to another server after
	// a server failed.
	Continuations int `json:"continuations"`
	Retries       int `json:"retries"`
	// Failures are the server failures the call moved away from, in order.
	Failures []ServerFailure `json:"failures,omitempty"`
}

// ServerFailure is one request of a Generate call that failed on a server before the call
// moved on.
type ServerFailure struct {
	ServerID string `json:"server_id"`
	Error    string `json:"error"`
}

// Generate generates req.N samples of the prompt on the fleet. It routes to an in-rotation,
// healthy server at MinVersion or above by load and prompt affinity, retries on another server
// when one fails, and continues a sample that a pause aborted (resubmitting the prompt plus
// the tokens so far, on whichever server is in rotation), so every sample is whole and every
// token carries its weight version and logprob.
//
// Errors: ErrInvalid (bad request or sampling parameters, refused before any server sees
// them), ErrNoServers (no live server), ErrStale (no server at MinVersion in time),
// ErrTimeout (no server came into rotation within Options.RouteTimeout), ErrRejected (a
// server refused the request: retrying the same request will not help), ErrClosed, or the
// context's error. The result is nil with any error: a group is whole or not at all.
func (c *Client) Generate(ctx context.Context, req GenerateRequest) (res *GenerateResult, err error) {
	ctx, span := c.tracer.Start(ctx, "sdk.generate", trace.WithSpanKind(trace.SpanKindClient))
	defer func() { endSpan(span, err) }()
	if err := c.checkOpen(ctx); err != nil {
		return nil, err
	}
	if err := validateGenerate(&req); err != nil {
		return nil, err
	}
	g := &genCall{c: c, req: req, key: routingKey(req)}
	g.snap = c.aborts.begin(req.RequestID)
	defer c.aborts.end(req.RequestID)
	res = &GenerateResult{RequestID: req.RequestID, Samples: make([]Sample, req.N)}

	out, server, err := g.segment(ctx, req.RequestID, req.PromptTokenIDs, req.N, req.Sampling, res)
	if err != nil {
		return nil, err
	}
	if len(out.Outputs) != req.N {
		return nil, fmt.Errorf("sdk: server %s returned %d outputs for n=%d", server, len(out.Outputs), req.N)
	}
	var wg sync.WaitGroup
	var firstErr error
	for i, o := range out.Outputs {
		s := &res.Samples[i]
		s.NumCachedTokens = o.NumCachedTokens
		appendOutput(s, o, server)
		if g.needsContinuation(s) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := g.continueSample(ctx, i, s, res); err != nil {
					g.mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					g.mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	for _, s := range res.Samples {
		res.Continuations += s.Continuations
		for _, id := range s.Servers {
			if !slices.Contains(res.Servers, id) {
				res.Servers = append(res.Servers, id)
			}
		}
	}
	span.SetAttributes(attribute.String("rollout.request_id", req.RequestID), attribute.Int("rollout.n", req.N),
		attribute.StringSlice("rollout.servers", res.Servers), attribute.Int("rollout.continuations", res.Continuations),
		attribute.Int("rollout.retries", res.Retries))
	return res, nil
}

// samplingDefaults applies the temperature and logprob-mode defaults and refuses a greedy
// group of identical samples that was not asked for.
func samplingDefaults(p *SamplingParams, n int) error {
	switch {
	case p.Greedy && p.Temperature != 0:
		return invalid("greedy decoding with temperature %v: set one of them", p.Temperature)
	case !p.Greedy && p.Temperature == 0:
		p.Temperature = DefaultTemperature
	}
	greedy := p.Greedy || (p.Temperature > 0 && p.Temperature < GreedyTemperature)
	if greedy && n > 1 && !p.AllowIdenticalSamples {
		return invalid("n=%d with greedy decoding (temperature %v) gives %d identical samples, whose GRPO advantages are all 0: "+
			"sample with a temperature (0 means %v), or set AllowIdenticalSamples", n, p.Temperature, n, DefaultTemperature)
	}
	switch p.LogprobMode {
	case "":
		p.LogprobMode = LogprobProcessed
	case LogprobProcessed, LogprobRaw:
	default:
		return invalid("logprob_mode must be %q or %q (got %q)", LogprobProcessed, LogprobRaw, p.LogprobMode)
	}
	return nil
}

func validateGenerate(req *GenerateRequest) error {
	if len(req.PromptTokenIDs) == 0 {
		return invalid("empty prompt")
	}
	for i, t := range req.PromptTokenIDs {
		if t < 0 {
			return invalid("prompt token %d is negative (%d)", i, t)
		}
	}
	if req.N == 0 {
		req.N = 1
	}
	if req.N < 0 {
		return invalid("n must be >= 1 (got %d)", req.N)
	}
	if req.Sampling.MaxTokens == 0 {
		req.Sampling.MaxTokens = DefaultMaxTokens
	}
	if err := samplingDefaults(&req.Sampling, req.N); err != nil {
		return err
	}
	p := req.Sampling
	switch {
	case p.MaxTokens < 0:
		return invalid("max_tokens must be > 0 (got %d)", p.MaxTokens)
	case math.IsNaN(p.Temperature) || p.Temperature < 0:
		return invalid("temperature must be >= 0 (got %v)", p.Temperature)
	case math.IsNaN(p.TopP) || p.TopP < 0 || p.TopP > 1:
		return invalid("top_p must be in [0, 1] (got %v)", p.TopP)
	case p.TopK < -1:
		return invalid("top_k must be >= -1 (got %d)", p.TopK)
	case math.IsNaN(p.MinP) || p.MinP < 0 || p.MinP > 1:
		return invalid("min_p must be in [0, 1] (got %v)", p.MinP)
	case p.Logprobs < 0:
		return invalid("logprobs must be >= 0 (got %d)", p.Logprobs)
	case req.MinVersion < 0:
		return invalid("min_version must be >= 0 (got %d)", req.MinVersion)
	}
	if req.RequestID == "" {
		req.RequestID = "sdk-" + protocol.NewID()[:16]
	}
	return nil
}

// genCall is one Generate call in progress.
type genCall struct {
	c    *Client
	req  GenerateRequest
	key  uint64
	snap uint64     // the client's abort-all count when the call began
	mu   sync.Mutex // guards the result's Retries and the first error, across samples' continuations
}

// needsContinuation reports whether a pause (not the caller) cut s short.
func (g *genCall) needsContinuation(s *Sample) bool {
	return s.FinishReason == FinishAbort && len(s.Tokens) < g.req.Sampling.MaxTokens && !g.c.aborts.aborted(g.req.RequestID, g.snap)
}

// continueSample resubmits sample i (prompt + its tokens) until it finishes.
func (g *genCall) continueSample(ctx context.Context, i int, s *Sample, res *GenerateResult) error {
	stuck := 0 // continuations in a row that returned no token
	for g.needsContinuation(s) {
		if stuck > maxRetries {
			return fmt.Errorf("%w: sample %d of %s was aborted %d times in a row without a new token", ErrFailed, i, g.req.RequestID, stuck)
		}
		s.Continuations++
		prompt := make([]int, 0, len(g.req.PromptTokenIDs)+len(s.Tokens))
		prompt = append(prompt, g.req.PromptTokenIDs...)
		for _, t := range s.Tokens {
			prompt = append(prompt, t.ID)
		}
		p := g.req.Sampling
		p.MaxTokens -= len(s.Tokens)
		if p.Seed != nil {
			sd := *p.Seed + int64(i) + int64(1000003*s.Continuations)
			p.Seed = &sd
		}
		id := g.req.RequestID + "-s" + strconv.Itoa(i) + "-c" + strconv.Itoa(s.Continuations)
		out, server, err := g.segment(ctx, id, prompt, 1, p, res)
		if err != nil {
			return err
		}
		if len(out.Outputs) != 1 {
			return fmt.Errorf("sdk: server %s returned %d outputs for a continuation", server, len(out.Outputs))
		}
		if o := out.Outputs[0]; len(o.TokenIDs) == 0 && o.FinishReason == FinishAbort {
			stuck++
		} else {
			stuck = 0
		}
		appendOutput(s, out.Outputs[0], server)
	}
	if s.FinishReason == FinishAbort && len(s.Tokens) >= g.req.Sampling.MaxTokens {
		s.FinishReason = FinishLength // aborted exactly at its last token
	}
	return nil
}

func appendOutput(s *Sample, o wireOutput, server string) {
	for j, id := range o.TokenIDs {
		t := Token{ID: id, Logprob: math.Inf(-1)}
		if j < len(o.Logprobs) {
			t.Logprob = float64(o.Logprobs[j]) // null on the wire is already -Inf
		}
		if j < len(o.WeightVersions) {
			t.WeightVersion = o.WeightVersions[j]
		}
		if j < len(o.TopLogprobs) {
			for _, tl := range o.TopLogprobs[j] {
				t.Top = append(t.Top, TokenLogprob{Token: tl.Token, Logprob: float64(tl.Logprob)})
			}
		}
		s.Tokens = append(s.Tokens, t)
	}
	s.FinishReason = o.FinishReason
	s.Segments = append(s.Segments, Segment{Server: server, Tokens: len(o.TokenIDs)})
	if len(s.Servers) == 0 || s.Servers[len(s.Servers)-1] != server {
		s.Servers = append(s.Servers, server)
	}
}

// The native /generate wire shapes are protocol's, shared with the server.
type (
	wireRequest  = protocol.GenerateRequest[SamplingParams]
	wireResponse = protocol.GenerateResponse
	wireOutput   = protocol.GenerateOutput
)

// wireError is the servers' JSON error shape (docs/http-api.md).
type wireError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    any    `json:"code"`
	} `json:"error"`
}

// segment sends one /generate request, moving to another server when one fails.
func (g *genCall) segment(ctx context.Context, id string, prompt []int, n int, p SamplingParams, res *GenerateResult) (*wireResponse, string, error) {
	g.c.aborts.track(g.req.RequestID, id, n)
	defer g.c.aborts.untrack(g.req.RequestID, id, n)
	exclude := map[string]bool{}
	var lastErr error
	for attempt := 0; ; attempt++ {
		cand, err := g.c.pick(ctx, g.key, g.req.pin, g.req.MinVersion, n, exclude)
		if err != nil {
			if lastErr != nil {
				return nil, "", fmt.Errorf("%w (last failure: %w)", err, lastErr)
			}
			return nil, "", err
		}
		// The request carries the floor it was routed by (at least the fleet's committed
		// version): a server below it refuses rather than serves, whatever this client's
		// view of it said.
		body, err := json.Marshal(wireRequest{PromptTokenIDs: prompt, N: n, Sampling: p, RequestID: id, CacheSalt: g.req.CacheSalt, MinVersion: cand.floor})
		if err != nil {
			g.c.release(cand.id, n)
			return nil, "", fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		out, err := g.c.post(ctx, cand.url, body)
		g.c.release(cand.id, n)
		if err == nil {
			return out, cand.id, nil
		}
		if ctx.Err() != nil {
			return nil, "", ctxError(ctx)
		}
		var he *httpError
		if errors.As(err, &he) && !he.retryable() {
			return nil, "", fmt.Errorf("%w: server %s: %w", ErrRejected, cand.id, err)
		}
		lastErr = fmt.Errorf("server %s: %w", cand.id, err)
		g.c.log.Debug("sdk: generate moving to another server", "server", cand.id, "err", err)
		if errors.As(err, &he) && he.status == http.StatusConflict {
			exclude[cand.id] = true // behind MinVersion: fine for others, not for this call
		} else {
			g.c.suspect(cand.id)
		}
		g.mu.Lock()
		res.Retries++
		res.Failures = append(res.Failures, ServerFailure{ServerID: cand.id, Error: err.Error()})
		g.mu.Unlock()
		if attempt >= maxRetries {
			return nil, "", fmt.Errorf("sdk: generate gave up after %d attempts: %w", attempt+1, lastErr)
		}
	}
}

func ctxError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrTimeout, ctx.Err())
	}
	return ctx.Err()
}

// httpError is a non-200 answer of a server.
type httpError struct {
	status  int
	code    string
	message string
}

func (e *httpError) Error() string {
	if e.code != "" {
		return fmt.Sprintf("HTTP %d %s: %s", e.status, e.code, e.message)
	}
	return fmt.Sprintf("HTTP %d: %s", e.status, e.message)
}

// retryable: the server is unavailable, overloaded or behind; another one may do.
func (e *httpError) retryable() bool {
	return e.status >= 500 || e.status == http.StatusTooManyRequests || e.status == http.StatusConflict
}

// post sends one /generate request to base.
func (c *Client) post(ctx context.Context, base string, body []byte) (*wireResponse, error) {
	data, err := c.postJSON(ctx, base, "/generate", body)
	if err != nil {
		return nil, err
	}
	var out wireResponse
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("decoding /generate response: %w", err)
	}
	return &out, nil
}

// postJSON sends a JSON body to base+path and returns the 200 answer's body, or an
// *httpError carrying the server's JSON error.
func (c *Client) postJSON(ctx context.Context, base, path string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.opts.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.APIKey)
	}
	c.prop.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		he := &httpError{status: resp.StatusCode, message: string(bytes.TrimSpace(data))}
		var we wireError
		if json.Unmarshal(data, &we) == nil && we.Error.Message != "" {
			he.message = we.Error.Message
			if s, ok := we.Error.Code.(string); ok {
				he.code = s
			}
		}
		return nil, he
	}
	return data, nil
}

// pick waits for a routable server for a request of n sequences and counts the request in
// its load; release undoes that.
func (c *Client) pick(ctx context.Context, key uint64, pin string, minVersion int64, n int, exclude map[string]bool) (candidate, error) {
	deadline := time.NewTimer(c.opts.RouteTimeout)
	defer deadline.Stop()
	reread := false
	for {
		c.mu.Lock()
		cands, wait, why := c.candidates(minVersion, exclude)
		if len(cands) == 0 && why == nil && len(exclude) > 0 {
			clear(exclude) // every server failed this call once: give them another chance
			cands, wait, why = c.candidates(minVersion, exclude)
		}
		if i := choose(cands, key, pin, n); i >= 0 {
			c.view[cands[i].id].inflight += n
			c.mu.Unlock()
			return cands[i], nil
		}
		c.mu.Unlock()
		if errors.Is(why, ErrNoServers) && !reread {
			// The view may be out of date (after a Redis restart): reread before refusing.
			reread = true
			if err := c.refresh(ctx, false); err == nil {
				continue
			}
		}
		if why != nil {
			return candidate{}, why
		}
		c.kickRefresh()
		select {
		case <-wait:
		case <-ctx.Done():
			return candidate{}, ctxError(ctx)
		case <-c.stop:
			return candidate{}, ErrClosed
		case <-deadline.C:
			return candidate{}, c.routeTimeoutError(minVersion)
		}
	}
}

// candidates lists the routable servers; c.mu is held. With none it returns the channel to
// wait on for the next refresh, or an error when waiting cannot help.
func (c *Client) candidates(minVersion int64, exclude map[string]bool) ([]candidate, <-chan struct{}, error) {
	var cands []candidate
	live, atVersion := 0, 0
	var desired int64
	var desiredSHA string
	if c.desired != nil && c.desired.Weights != nil {
		desired, desiredSHA = c.desired.Weights.Version, c.desired.Weights.SHA256
	}
	floor := max(minVersion, desired)
	fleetPaused := c.desired != nil && (c.desired.Paused || c.desired.Sleep > 0)
	for id, v := range c.view {
		if !v.live {
			continue
		}
		live++
		if v.hb.WeightVersion >= minVersion {
			atVersion++
		}
		// Below the desired version a server is stale whatever its last heartbeat said (it
		// may predate the update this client just committed).
		// At the desired version it must also be the desired checkpoint.
		inRotation := v.hb.InRotation && v.hb.State.Serving() && v.hb.WeightVersion >= floor &&
			(v.hb.WeightVersion > desired || desired == 0 || v.hb.WeightSHA256 == desiredSHA)
		// A server this client is committing new weights to takes requests too: its engine
		// queues them while paused or asleep and runs them first after the resume, on the new
		// weights. So a sample a pause aborted goes back home and waits out the cut there, and
		// the server's bubble is the cut itself, not the cut plus the wait for a heartbeat.
		committing := v.committing > 0 && max(v.hb.WeightVersion, v.committing) >= max(minVersion, desired) && !fleetPaused
		if !inRotation && !committing || !v.suspect.IsZero() || exclude[id] || v.hb.AdvertiseURL == "" {
			continue
		}
		// The heartbeat's count already holds this client's requests that were running when
		// it was written: adding inflight counted them twice, and a session whose home ran its
		// share of a fleet's episodes looked overloaded and was moved off its cached KV. The
		// larger of the two is the load: the server's word, or this client's own requests
		// when the heartbeat predates them.
		load := max(v.hb.Running+v.hb.Waiting, v.inflight)
		cands = append(cands, candidate{id: id, url: v.hb.AdvertiseURL, load: load, floor: floor})
	}
	if len(cands) > 0 {
		slices.SortFunc(cands, func(a, b candidate) int { return compareStrings(a.id, b.id) })
		return cands, nil, nil
	}
	if live == 0 {
		return nil, nil, fmt.Errorf("%w: fleet %q has no live server", ErrNoServers, c.opts.Fleet)
	}
	if atVersion == 0 && desired < minVersion {
		return nil, nil, fmt.Errorf("%w: no server serves version %d and the fleet's desired version is %d", ErrStale, minVersion, desired)
	}
	return nil, c.refreshed, nil
}

func (c *Client) routeTimeoutError(minVersion int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range c.view {
		if v.live && v.hb.WeightVersion >= minVersion {
			return fmt.Errorf("%w: no server in rotation within %s", ErrTimeout, c.opts.RouteTimeout)
		}
	}
	return fmt.Errorf("%w: no server reached version %d within %s", ErrStale, minVersion, c.opts.RouteTimeout)
}

func (c *Client) release(id string, n int) {
	c.mu.Lock()
	if v := c.view[id]; v != nil {
		v.inflight -= n
	}
	c.mu.Unlock()
}

// suspect takes a server out of routing until it heartbeats again.
func (c *Client) suspect(id string) {
	c.mu.Lock()
	if v := c.view[id]; v != nil {
		v.suspect = time.Now()
	}
	c.mu.Unlock()
	c.kickRefresh()
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// abortLog remembers the aborts the caller asked for, so Generate does not continue a
// sample the caller meant to stop, and knows the server-side ids of each request in flight.
type abortLog struct {
	mu       sync.Mutex
	all      uint64                    // abort-all calls so far
	byCaller map[string]bool           // request ids the caller aborted, while in flight
	inflight map[string]map[string]int // request id → server-side request ids → n
}

func (l *abortLog) begin(reqID string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inflight == nil {
		l.inflight, l.byCaller = map[string]map[string]int{}, map[string]bool{}
	}
	if l.inflight[reqID] == nil {
		l.inflight[reqID] = map[string]int{}
	}
	return l.all
}

func (l *abortLog) end(reqID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.inflight, reqID)
	delete(l.byCaller, reqID)
}

func (l *abortLog) track(reqID, segID string, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m := l.inflight[reqID]; m != nil {
		m[segID] = n
	}
}

func (l *abortLog) untrack(reqID, segID string, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m := l.inflight[reqID]; m != nil {
		delete(m, segID)
	}
}

func (l *abortLog) aborted(reqID string, snap uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.all > snap || l.byCaller[reqID]
}

// record notes an abort and returns the ids to send: the caller's plus the server-side ids
// of those of its requests that this client has in flight (a group of n runs as id-0 ..
// id-(n-1) on a server; continuations run under their own ids).
func (l *abortLog) record(ids []string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(ids) == 0 {
		l.all++
		return nil
	}
	out := slices.Clone(ids)
	for _, id := range ids {
		segs, ok := l.inflight[id]
		if !ok {
			continue
		}
		l.byCaller[id] = true
		for seg, n := range segs {
			if seg != id {
				out = append(out, seg)
			}
			if n > 1 {
				for k := range n {
					out = append(out, seg+"-"+strconv.Itoa(k))
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// committing marks (version > 0) or clears (0) a commit of this client in flight to ids.
func (c *Client) committing(ids []string, version int64) {
	c.mu.Lock()
	for _, id := range ids {
		if v := c.view[id]; v != nil {
			v.committing = version
		}
	}
	c.mu.Unlock()
}
