package sdk

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/sdk/toolcall"
)

// TokenSource says who produced a token of a session's transcript.
type TokenSource uint8

const (
	// SourceModel is a token the policy sampled: it is trained on (loss mask 1).
	SourceModel TokenSource = 1
	// SourceEnv is a token the environment appended (a tool result, a user or system turn,
	// chat-template glue): context only (loss mask 0).
	SourceEnv TokenSource = 0
)

// SessionToken is one token of a session's transcript after its prompt.
type SessionToken struct {
	ID     int         `json:"id"`
	Source TokenSource `json:"source"`
	// Logprob and WeightVersion are the sampling logprob and the weight version of a model
	// token; zero for environment tokens.
	Logprob       float64 `json:"logprob"`
	WeightVersion int64   `json:"weight_version"`
	// Turn is the index of the model turn the token belongs to or follows (0 for environment
	// tokens appended before the first turn).
	Turn int `json:"turn"`
}

// SessionOptions configure a Session.
type SessionOptions struct {
	// ID names the session; turns run on the servers as ID-t<k> (default: a random id).
	ID string
	// AffinityKey keeps every turn on one server, so turn k+1 finds turn k's KV in that
	// server's prefix cache or CPU tier (default: ID). Unlike the cache salt it does not
	// partition the cache: sessions that share a system prompt still share its KV on a
	// server, and different keys spread the sessions over the fleet.
	AffinityKey string
	// CacheSalt partitions the servers' prefix cache for every turn (optional).
	CacheSalt string
	// Sampling is every turn's sampling (a turn may override it). MaxTokens bounds one turn.
	Sampling SamplingParams
	// MinVersion is the lowest weight version a turn may start on.
	MinVersion int64
	// Decode turns a model turn's token ids into text, for tool-call parsing (optional: with
	// no Decode, turns carry no text and no calls). Any tokenizer of the served model does;
	// the SDK itself has none. When it fails or panics the turn fails with ErrDecode and is
	// not kept.
	Decode func(ctx context.Context, ids []int) (string, error)
	// ToolFormat is the tool-call syntax Decode's text is parsed with (empty: toolcall.Auto).
	ToolFormat toolcall.Format
}

// Session is one multi-turn episode held as token ids: a prompt, then model turns
// (Generate) and environment tokens (Append) in the order they happened. Nothing is ever
// re-tokenized: turn k+1's prompt is the exact ids of everything before it, so the
// trajectory a trainer sees is the one the policy was conditioned on. Every turn of a
// session is routed by its affinity key to one server (while that server is healthy and in
// rotation), which therefore already holds the transcript's KV.
//
// When that server fails (killed, out of rotation, behind the fleet's version) the turn
// moves to another one, like any Generate request: the transcript is held here as token ids,
// so any server can continue it, and only the KV cache is lost. The session then re-pins:
// later turns go to the server that ran the last turn while it is routable and within the
// routing's load bound, also once the old home is back (it lost the KV). A turn fails, with
// the transcript unchanged, only when no server can take it (ErrNoServers, ErrTimeout,
// ErrStale), when a server rejects it (ErrRejected) or when ctx ends.
//
// A weight update during a turn does not break the episode: the turn is continued like any
// Generate sample a pause aborted, and every model token keeps the version that sampled it.
//
// A Session's methods may be called from several goroutines: turns run one at a time, and
// Append and the readers wait for a turn in flight, so the transcript is always whole turns
// in the order they happened.
type Session struct {
	c    *Client
	opts SessionOptions

	mu     sync.Mutex
	prompt []int
	toks   []SessionToken
	turns  int
	// server is where the last turn ended: the next turn goes there first (it holds the
	// transcript's KV), whatever the affinity key's home is by now.
	server string
}

// Turn is the result of one model turn of a Session.
type Turn struct {
	// Index is the turn's number in its session, from 0.
	Index int `json:"index"`
	// Sample is the turn's generated tokens with their logprobs and versions, the servers
	// that generated them, continuations and the prompt tokens found cached.
	Sample Sample `json:"sample"`
	// PromptTokens is how long the transcript was when the turn started.
	PromptTokens int `json:"prompt_tokens"`
	// Text is the turn's decoded text (only with SessionOptions.Decode).
	Text string `json:"text,omitempty"`
	// Content is the text outside tool calls, and ToolCalls the calls parsed from Text in
	// SessionOptions.ToolFormat (only with Decode).
	Content   string          `json:"content,omitempty"`
	ToolCalls []toolcall.Call `json:"tool_calls,omitempty"`
	// ToolCallError is set when Text started a tool call that is not valid (it wraps
	// toolcall.ErrMalformed); Content is then the whole text.
	ToolCallError error `json:"-"`
}

// TurnOptions tune one turn of a Session.
type TurnOptions struct {
	// Sampling replaces the session's sampling for this turn when non-nil.
	Sampling *SamplingParams
}

// NewSession starts a session whose transcript begins with prompt (at least one token).
func (c *Client) NewSession(prompt []int, opts SessionOptions) (*Session, error) {
	if len(prompt) == 0 {
		return nil, invalid("session: empty prompt")
	}
	if err := checkIDs("session prompt", prompt); err != nil {
		return nil, err
	}
	if opts.MinVersion < 0 {
		return nil, invalid("session: min_version must be >= 0 (got %d)", opts.MinVersion)
	}
	if !toolcall.Valid(opts.ToolFormat) {
		return nil, invalid("session: unknown tool format %q", opts.ToolFormat)
	}
	if opts.ID == "" {
		opts.ID = "sess-" + protocol.NewID()[:16]
	}
	if opts.AffinityKey == "" {
		opts.AffinityKey = opts.ID
	}
	// Validate the sampling once, as the first turn would.
	probe := GenerateRequest{PromptTokenIDs: prompt, Sampling: opts.Sampling, RequestID: opts.ID}
	if err := validateGenerate(&probe); err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	return &Session{c: c, opts: opts, prompt: slices.Clone(prompt)}, nil
}

// ID returns the session's id.
func (s *Session) ID() string { return s.opts.ID }

// AffinityKey returns the key every turn is routed by.
func (s *Session) AffinityKey() string { return s.opts.AffinityKey }

func checkIDs(what string, ids []int) error {
	for i, t := range ids {
		if t < 0 {
			return invalid("%s token %d is negative (%d)", what, i, t)
		}
	}
	return nil
}

// Append adds environment tokens (a tool result, the next user message, template glue) to
// the transcript, as ids: they are context for later turns and masked out of the loss.
func (s *Session) Append(ids ...int) error {
	if len(ids) == 0 {
		return nil
	}
	if err := checkIDs("environment", ids); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		s.toks = append(s.toks, SessionToken{ID: id, Source: SourceEnv, Turn: s.turns})
	}
	return nil
}

// Generate runs the next model turn: it samples after the whole transcript on the session's
// server and appends the tokens to the transcript. A turn a weight update aborted is
// continued (possibly under the new version; each token records its own). On error the
// transcript is unchanged and the turn may be retried.
func (s *Session) Generate(ctx context.Context, opts TurnOptions) (turn *Turn, err error) {
	ctx, span := s.c.tracer.Start(ctx, "sdk.session.turn", trace.WithSpanKind(trace.SpanKindClient))
	defer func() { endSpan(span, err) }()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.opts.Sampling
	if opts.Sampling != nil {
		p = *opts.Sampling
	}
	transcript := s.transcriptLocked()
	req := GenerateRequest{PromptTokenIDs: transcript, N: 1, Sampling: p, MinVersion: s.opts.MinVersion,
		CacheSalt: s.opts.CacheSalt, AffinityKey: s.opts.AffinityKey, RequestID: s.opts.ID + "-t" + strconv.Itoa(s.turns),
		pin: s.server}
	span.SetAttributes(attribute.String("rollout.session", s.opts.ID), attribute.Int("rollout.turn", s.turns),
		attribute.Int("rollout.prompt_tokens", len(transcript)))
	res, err := s.c.Generate(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("session %s turn %d: %w", s.opts.ID, s.turns, err)
	}
	smp := res.Samples[0]
	t := &Turn{Index: s.turns, Sample: smp, PromptTokens: len(transcript)}
	if s.opts.Decode != nil {
		text, err := s.decode(ctx, textIDs(smp, p.StopTokenIDs))
		if err != nil {
			return nil, fmt.Errorf("session %s turn %d: %w: %w", s.opts.ID, s.turns, ErrDecode, err)
		}
		t.Text = text
		r, perr := toolcall.Parse(text, s.opts.ToolFormat)
		t.Content, t.ToolCalls, t.ToolCallError = r.Content, r.Calls, perr
	}
	for _, tok := range smp.Tokens {
		s.toks = append(s.toks, SessionToken{ID: tok.ID, Source: SourceModel, Logprob: tok.Logprob,
			WeightVersion: tok.WeightVersion, Turn: s.turns})
	}
	s.turns++
	if len(smp.Servers) > 0 {
		s.server = smp.Servers[len(smp.Servers)-1]
	}
	span.SetAttributes(attribute.Int("rollout.tokens", len(smp.Tokens)), attribute.Int("rollout.cached_tokens", smp.NumCachedTokens),
		attribute.StringSlice("rollout.servers", smp.Servers))
	return t, nil
}

// decode runs the caller's Decode, turning a panic into an error: a tokenizer that chokes on
// an odd id must fail the turn, not the process (a pipeline runs sessions on its goroutines).
func (s *Session) decode(ctx context.Context, ids []int) (text string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return s.opts.Decode(ctx, ids)
}

// textIDs are the ids of a turn's text: without the stop token that ended it (the chat
// template's end-of-turn marker, which is not the model's EOS and so would decode as text that
// follows a tool call). The token stays in the transcript.
func textIDs(smp Sample, stops []int) []int {
	ids := smp.TokenIDs()
	if n := len(ids); n > 0 && smp.FinishReason == FinishStop && slices.Contains(stops, ids[n-1]) {
		ids = ids[:n-1]
	}
	return ids
}

// transcriptLocked is the prompt and every token after it; s.mu is held.
func (s *Session) transcriptLocked() []int {
	out := make([]int, 0, len(s.prompt)+len(s.toks))
	out = append(out, s.prompt...)
	for _, t := range s.toks {
		out = append(out, t.ID)
	}
	return out
}

// Transcript returns the session's token ids so far: the prompt, then every model and
// environment token in order. The next turn's prompt is exactly this.
func (s *Session) Transcript() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.transcriptLocked()
}

// Tokens returns the transcript after the prompt with each token's source, logprob and
// version.
func (s *Session) Tokens() []SessionToken {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.toks)
}

// Turns returns how many model turns have run.
func (s *Session) Turns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.turns
}

// Trajectory is a session exported for training: the prompt, then the completion (every
// model and environment token after it, in order) with one logprob, weight version and loss
// mask entry per completion token. The fields have the types of trainer.Sample's
// (Prompt, Completion, Logprobs, Versions, LossMask), so a reference-trainer sample is
//
//	trainer.Sample{Prompt: tr.Prompt, Completion: tr.Completion, Logprobs: tr.Logprobs,
//		Versions: tr.Versions, LossMask: tr.LossMask, Reward: r, Group: g}
type Trajectory struct {
	Prompt     []int
	Completion []int
	// Logprobs are the model tokens' sampling logprobs (0 for environment tokens).
	Logprobs []float32
	// Versions are the model tokens' weight versions (0 for environment tokens).
	Versions []int64
	// LossMask is 1 for model tokens and 0 for environment tokens.
	LossMask []uint8
	// ModelTokens counts the completion's model tokens (the mask's ones).
	ModelTokens int
}

// Trajectory exports the session for a trainer. The trainer's Sample.Prompt must not be
// empty, so the session's prompt is the trajectory's prompt.
func (s *Session) Trajectory() Trajectory {
	s.mu.Lock()
	defer s.mu.Unlock()
	tr := Trajectory{Prompt: slices.Clone(s.prompt), Completion: make([]int, len(s.toks)),
		Logprobs: make([]float32, len(s.toks)), Versions: make([]int64, len(s.toks)), LossMask: make([]uint8, len(s.toks))}
	for i, t := range s.toks {
		tr.Completion[i] = t.ID
		if t.Source == SourceModel {
			tr.Logprobs[i], tr.Versions[i], tr.LossMask[i] = float32(t.Logprob), t.WeightVersion, 1
			tr.ModelTokens++
		}
	}
	return tr
}
