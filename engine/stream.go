package engine

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/rolloutkit/rollout/engine/sample"
)

// FinishReason says why a request ended.
type FinishReason string

// Finish reasons, as in the OpenAI API.
const (
	FinishStop   FinishReason = "stop"   // EOS or a stop token
	FinishLength FinishReason = "length" // max_tokens or the context length
	FinishAbort  FinishReason = "abort"  // aborted by the client, a pause or shutdown
)

// Token is one generated token.
type Token struct {
	ID      int
	Logprob float32
	// Top holds the top-k logprobs when the request asked for them.
	Top []sample.TokenLogprob
	// WeightVersion is the version of the weights that produced this token. Tokens of one
	// request can differ in version when a weight swap happened while it was paused.
	WeightVersion int64
}

// Output is what one Recv returns: the tokens generated since the previous Recv and, at the
// end, the finish reason.
type Output struct {
	Tokens       []Token
	Finished     bool
	FinishReason FinishReason
	// NumCachedTokens is the number of prompt tokens served from a cache (prefix cache or
	// offloaded KV) when the request was first scheduled.
	NumCachedTokens int
}

// Timings of a finished request.
type Timings struct {
	Arrival, FirstToken, Finish time.Time
}

// Stream delivers one request's outputs. The engine never blocks on a slow reader: tokens
// accumulate in the stream until read.
type Stream struct {
	id     string
	engine *Engine
	notify chan struct{}

	mu       sync.Mutex
	pending  []Token
	finished bool
	reason   FinishReason
	cached   int
	taken    bool // the final Output was returned
	// quiet: the reader waits for the end only (Collect), so tokens do not wake it. With 64
	// requests decoding, per-token wake-ups are 64 goroutine switches per engine step.
	quiet   bool
	timings Timings
}

func newStream(e *Engine, id string, arrival time.Time) *Stream {
	return &Stream{id: id, engine: e, notify: make(chan struct{}, 1), timings: Timings{Arrival: arrival}}
}

// ID is the request id.
func (s *Stream) ID() string { return s.id }

// Timings returns the request's timings so far (zero FirstToken or Finish: not yet).
func (s *Stream) Timings() Timings {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.timings
}

// push is called by the engine goroutine.
func (s *Stream) push(toks []Token, cached int, reason FinishReason, now time.Time) {
	s.mu.Lock()
	if s.finished {
		s.mu.Unlock()
		return
	}
	if len(toks) > 0 && s.timings.FirstToken.IsZero() {
		s.timings.FirstToken = now
	}
	s.pending = append(s.pending, toks...)
	s.cached = cached
	if reason != "" {
		s.finished, s.reason, s.timings.Finish = true, reason, now
	}
	wake := !s.quiet || s.finished
	s.mu.Unlock()
	if wake {
		select {
		case s.notify <- struct{}{}:
		default:
		}
	}
}

// Recv blocks until new tokens or the end arrive and returns them. After the final Output
// (Finished set) it returns io.EOF. A cancelled ctx returns ctx.Err() and leaves the request
// running; use Abort to stop it.
func (s *Stream) Recv(ctx context.Context) (Output, error) {
	for {
		s.mu.Lock()
		if s.taken {
			s.mu.Unlock()
			return Output{}, io.EOF
		}
		if len(s.pending) > 0 || s.finished {
			out := Output{Tokens: s.pending, Finished: s.finished, FinishReason: s.reason, NumCachedTokens: s.cached}
			s.pending = nil
			s.taken = s.finished
			s.mu.Unlock()
			return out, nil
		}
		s.mu.Unlock()
		select {
		case <-s.notify:
		case <-ctx.Done():
			return Output{}, ctx.Err()
		}
	}
}

// Result is a whole finished request.
type Result struct {
	Tokens          []Token
	FinishReason    FinishReason
	NumCachedTokens int
	Timings         Timings
}

// TokenIDs lists the generated token ids.
func (r Result) TokenIDs() []int {
	ids := make([]int, len(r.Tokens))
	for i, t := range r.Tokens {
		ids[i] = t.ID
	}
	return ids
}

// Collect reads the rest of the stream (the tokens not yet returned by Recv) to its end.
// It is woken once, at the end, not per token; mixing it with concurrent Recv calls on the
// same stream is not supported.
func (s *Stream) Collect(ctx context.Context) (Result, error) {
	var r Result
	s.mu.Lock()
	s.quiet = true
	s.mu.Unlock()
	for {
		out, err := s.Recv(ctx)
		if errors.Is(err, io.EOF) {
			s.mu.Lock()
			r.FinishReason, r.NumCachedTokens, r.Timings = s.reason, s.cached, s.timings
			s.mu.Unlock()
			return r, nil
		}
		if err != nil {
			return r, err
		}
		r.Tokens = append(r.Tokens, out.Tokens...)
	}
}

// Abort stops the request (a no-op once it finished); the stream then ends with FinishAbort.
func (s *Stream) Abort() { s.engine.Abort(s.id) }
