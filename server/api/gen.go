package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/sample"
	"github.com/rolloutkit/rollout/engine/tokenizer"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// readJSON reads the body (bounded by bodyLimit) and decodes it into v. Invalid UTF-8 is
// refused rather than silently replaced, and a wrong type names the field.
func readJSON(c *gin.Context, v any) error {
	body := requestBody(c)
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest("empty_body", "", "empty request body: want a JSON object")
	}
	if !utf8.Valid(body) {
		return badRequest("invalid_utf8", "", "request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			f := jsonField(te.Field)
			return badRequest("invalid_type", f, "field %q: got JSON %s, want %s", f, te.Value, jsonType(te.Type))
		}
		return badRequest("invalid_json", "", "malformed JSON: %v", err)
	}
	if dec.More() {
		return badRequest("invalid_json", "", "malformed JSON: trailing data after the object")
	}
	return nil
}

// jsonField is the request field a decoding error names: the JSON path without the Go
// names of embedded structs (encoding/json reports "Params.max_tokens" for a promoted field).
func jsonField(path string) string {
	parts := strings.Split(path, ".")
	out := parts[:0]
	for _, p := range parts {
		if p != "" && p[0] >= 'A' && p[0] <= 'Z' {
			continue // a Go struct name, not a JSON key (every key of the API is lower case)
		}
		out = append(out, p)
	}
	return strings.Join(out, ".")
}

// jsonType names a Go kind as the JSON type the field wants, without Go type names.
func jsonType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer that fits"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "another type"
}

// genSpec is what a route asks the engine for: every prompt n times.
type genSpec struct {
	clientID  string
	prompts   [][]int
	n         int
	params    sample.Params
	cacheSalt string
	stops     []string // stop strings (text routes only)
	text      bool     // decode text for the choices
}

// choice is one generated sequence of a request.
type choice struct {
	index    int
	prompt   []int
	engineID string
	stream   *engine.Stream
	tokens   []engine.Token
	finish   engine.FinishReason
	cached   int
	done     bool
	text     *textProc
}

// genRun is a submitted request: its choices and how to end them.
type genRun struct {
	a       *API
	ctx     context.Context //nolint:containedctx // the request's, for the spans end records
	prompts [][]int
	choices []*choice
	live    *liveRun // its engine ids while tracked
}

// validatePrompt checks one prompt against the model before the engine sees it.
func (a *API) validatePrompt(p []int, maxTokens int, param string) error {
	mc := a.cfg.ModelConfig
	if len(p) == 0 {
		return badRequest("empty_prompt", param, "empty prompt")
	}
	for i, id := range p {
		if id < 0 || id >= mc.VocabSize {
			return badRequest("invalid_token_id", param, "token %d: id %d is outside the vocabulary [0, %d)", i, id, mc.VocabSize)
		}
	}
	if len(p) >= mc.MaxPositionEmbeddings {
		return badRequest("context_length_exceeded", param, "prompt of %d tokens leaves no room in the context of %d tokens", len(p), mc.MaxPositionEmbeddings)
	}
	// Subtract rather than add: len(p)+maxTokens wraps for a max_tokens near MaxInt.
	if maxTokens > mc.MaxPositionEmbeddings-len(p) {
		return badRequest("context_length_exceeded", "max_tokens", "prompt (%d tokens) + max_tokens (%d) exceeds the context of %d tokens",
			len(p), maxTokens, mc.MaxPositionEmbeddings)
	}
	return nil
}

// checkN bounds n on its own, before anything multiplies it.
func (a *API) checkN(n int) error {
	if n < 1 {
		return badRequest("invalid_value", "n", "n must be >= 1 (got %d)", n)
	}
	if n > a.cfg.MaxN {
		return badRequest("invalid_value", "n", "n must be <= %d (got %d)", a.cfg.MaxN, n)
	}
	return nil
}

// prepare fills defaults and validates the spec's parameters and prompts.
func (a *API) prepare(s *genSpec) error {
	if len(s.prompts) == 0 {
		return badRequest("empty_prompt", "prompt", "no prompt")
	}
	// Bound each factor before multiplying: n × prompts wraps for a huge n.
	if err := a.checkN(s.n); err != nil {
		return err
	}
	if len(s.prompts) > a.cfg.MaxN/s.n {
		return badRequest("invalid_value", "n", "n (%d) × prompts (%d) exceeds the limit of %d sequences per request", s.n, len(s.prompts), a.cfg.MaxN)
	}
	s.params = s.params.WithDefaults()
	if err := s.params.Validate(a.cfg.ModelConfig.VocabSize); err != nil {
		return err
	}
	for _, p := range s.prompts {
		if err := a.validatePrompt(p, s.params.MaxTokens, "prompt"); err != nil {
			return err
		}
	}
	for _, st := range s.stops {
		if st == "" {
			return badRequest("invalid_value", "stop", "stop strings must not be empty")
		}
	}
	return nil
}

// submit adds every choice to the engine; on error nothing stays running.
func (a *API) submit(ctx context.Context, s genSpec) (*genRun, error) {
	total := s.n * len(s.prompts)
	run := &genRun{a: a, ctx: ctx, prompts: s.prompts}
	// Engine ids are the server's own: a client's request_id is echoed, and names the request
	// for /abort_requests, but two clients choosing the same one never collide.
	base := a.newID("r")
	ids := make([]string, total)
	for k := range ids {
		ids[k] = base
		if total > 1 {
			ids[k] = base + "-" + strconv.Itoa(k)
		}
	}
	// Tracked before the first Add, so that an /abort_requests arriving while later choices
	// are still being added finds every choice the engine has already taken, and marks the
	// run so that the choices it had not yet taken are aborted below.
	run.live = a.track(s.clientID, ids)
	for pi, p := range s.prompts {
		for i := range s.n {
			k := pi*s.n + i
			eid := ids[k]
			params := s.params
			if params.Seed != nil && i > 0 {
				// n samples of one prompt must differ; derive their seeds from the request's.
				sd := *params.Seed + int64(i)
				params.Seed = &sd
			}
			st, err := a.eng.Add(ctx, engine.Request{ID: eid, PromptTokenIDs: p, Sampling: params, CacheSalt: s.cacheSalt})
			if err != nil {
				run.abort()
				a.untrack(run.live)
				return nil, err
			}
			ch := &choice{index: k, prompt: p, engineID: eid, stream: st}
			if s.text {
				ch.text = newTextProc(a.tok, s.stops)
			}
			run.choices = append(run.choices, ch)
			if a.afterAdd != nil {
				a.afterAdd(k)
			}
		}
	}
	// An abort that reached the engine before a choice's Add missed that choice. Every choice
	// is in the engine now, and an abort marking the run after this check finds them all.
	if a.abortedDuring(run.live) {
		run.abort()
	}
	return run, nil
}

// abort stops every choice that has not finished; it is safe to call more than once.
func (r *genRun) abort() {
	var ids []string
	for _, ch := range r.choices {
		if !ch.done {
			ids = append(ids, ch.engineID)
		}
	}
	r.a.eng.Abort(ids...)
}

// end aborts what is left (a client that went away) and forgets the request.
func (r *genRun) end() {
	r.abort()
	if r.live != nil {
		r.a.untrack(r.live)
	}
	r.traceChoices()
}

// traceChoices records each choice's life in the engine as events of the request's span, from
// the engine's own timestamps (no cost on the engine loop, and no extra spans to export per
// request): engine.queued at arrival, engine.first_token (queueing and prefill end there) and
// engine.finished (decode ends there, with the token counts and finish reason).
func (r *genRun) traceChoices() {
	if r.ctx == nil {
		return
	}
	span := trace.SpanFromContext(r.ctx)
	if !span.IsRecording() {
		return
	}
	for _, ch := range r.choices {
		t := ch.stream.Timings()
		id := attribute.String("rollout.request_id", ch.engineID)
		span.AddEvent("engine.queued", trace.WithTimestamp(t.Arrival), trace.WithAttributes(id, attribute.Int("rollout.prompt_tokens", len(ch.prompt))))
		if !t.FirstToken.IsZero() {
			span.AddEvent("engine.first_token", trace.WithTimestamp(t.FirstToken), trace.WithAttributes(id,
				attribute.Float64("rollout.ttft_seconds", t.FirstToken.Sub(t.Arrival).Seconds())))
		}
		end := t.Finish
		if end.IsZero() {
			end = time.Now()
		}
		span.AddEvent("engine.finished", trace.WithTimestamp(end), trace.WithAttributes(id,
			attribute.Int("rollout.generated_tokens", len(ch.tokens)), attribute.Int("rollout.cached_tokens", ch.cached),
			attribute.String("rollout.finish_reason", string(ch.finish))))
	}
}

// apply folds one engine output into the choice. It returns the text released by this output
// (text routes) and whether the choice is now done.
func (ch *choice) apply(out engine.Output) (string, bool) {
	var sb strings.Builder
	for _, t := range out.Tokens {
		if ch.done {
			break
		}
		ch.tokens = append(ch.tokens, t)
		if ch.text != nil {
			delta, stopped := ch.text.push(t.ID)
			sb.WriteString(delta)
			if stopped {
				// A stop string ended the choice; the engine request is aborted by the caller.
				ch.done, ch.finish = true, engine.FinishStop
			}
		}
	}
	ch.cached = out.NumCachedTokens
	if out.Finished && !ch.done {
		ch.done, ch.finish = true, out.FinishReason
		if ch.text != nil {
			sb.WriteString(ch.text.flush())
		}
	}
	return sb.String(), ch.done
}

// collect runs every choice to its end (non-streaming routes).
func (r *genRun) collect(ctx context.Context) error {
	for _, ch := range r.choices {
		if ch.text == nil || len(ch.text.stops) == 0 {
			// Nothing can end the choice early, so wait for the end without a wake-up per token.
			res, err := ch.stream.Collect(ctx)
			if err != nil {
				return err
			}
			ch.apply(engine.Output{Tokens: res.Tokens, Finished: true, FinishReason: res.FinishReason, NumCachedTokens: res.NumCachedTokens})
			continue
		}
		for !ch.done {
			out, err := ch.stream.Recv(ctx)
			if err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return err
			}
			if _, done := ch.apply(out); done && !out.Finished {
				r.a.eng.Abort(ch.engineID)
			}
		}
	}
	return nil
}

// event is one output of one choice, for streaming.
type event struct {
	ch  *choice
	out engine.Output
	err error
}

// fanIn reads every choice's stream on its own goroutine and delivers the outputs in arrival
// order to fn, which returns false to stop early. Every goroutine has exited when it returns.
func (r *genRun) fanIn(ctx context.Context, fn func(ev event) bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan event, 4*len(r.choices))
	var wg sync.WaitGroup
	for _, ch := range r.choices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				out, err := ch.stream.Recv(ctx)
				if errors.Is(err, io.EOF) {
					return
				}
				select {
				case events <- event{ch: ch, out: out, err: err}:
				case <-ctx.Done():
					return
				}
				if err != nil || out.Finished {
					return
				}
			}
		}()
	}
	defer wg.Wait()
	defer cancel()
	remaining := len(r.choices)
	for remaining > 0 {
		select {
		case ev := <-events:
			if ev.err != nil {
				return ev.err
			}
			if ev.out.Finished {
				remaining--
			}
			if !fn(ev) {
				return nil
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// textProc turns a choice's tokens into text, applying stop strings: text that could still
// be the start of a stop string is held back until it cannot.
type textProc struct {
	tok      tokenizer.Tokenizer
	dec      *tokenizer.StreamDecoder
	stops    []string
	maxStop  int
	full     []byte
	released int
	stopped  bool
	offsets  []int // byte offset of each token's text in full
}

func newTextProc(tok tokenizer.Tokenizer, stops []string) *textProc {
	p := &textProc{tok: tok, dec: tokenizer.NewStreamDecoder(tok), stops: stops}
	for _, s := range stops {
		p.maxStop = max(p.maxStop, len(s))
	}
	return p
}

// push adds one token and returns the text it releases and whether a stop string matched.
func (p *textProc) push(id int) (string, bool) {
	if p.stopped {
		return "", true
	}
	p.offsets = append(p.offsets, len(p.full))
	if p.tok.IsControl(id) {
		return "", false
	}
	t, err := p.dec.Push(id)
	if err != nil {
		t = string(utf8.RuneError)
	}
	return p.add(t)
}

func (p *textProc) add(t string) (string, bool) {
	prev := len(p.full)
	p.full = append(p.full, t...)
	if len(p.stops) > 0 {
		from := max(0, prev-p.maxStop+1)
		best := -1
		for _, s := range p.stops {
			if i := bytes.Index(p.full[from:], []byte(s)); i >= 0 && (best < 0 || from+i < best) {
				best = from + i
			}
		}
		if best >= 0 {
			p.full = p.full[:best]
			p.stopped = true
			return p.release(len(p.full)), true
		}
	}
	return p.release(len(p.full) - p.holdBack()), false
}

// holdBack is the length of the longest suffix of the text that is a proper prefix of a stop
// string.
func (p *textProc) holdBack() int {
	hold := 0
	for _, s := range p.stops {
		for k := min(len(s)-1, len(p.full)-p.released); k > hold; k-- {
			if bytes.HasSuffix(p.full, []byte(s[:k])) {
				hold = k
				break
			}
		}
	}
	return hold
}

func (p *textProc) release(upTo int) string {
	if upTo <= p.released {
		return ""
	}
	s := string(p.full[p.released:upTo])
	p.released = upTo
	return s
}

// flush releases everything at the end of the sequence.
func (p *textProc) flush() string {
	if p.stopped {
		return ""
	}
	s, _ := p.add(p.dec.Flush())
	if p.stopped {
		return s
	}
	return s + p.release(len(p.full))
}

// String is the whole text so far (released or not).
func (p *textProc) String() string { return string(p.full) }

// tokenText renders one token on its own, for logprob listings.
func tokenText(tok tokenizer.Tokenizer, id int) string {
	b, err := tok.TokenBytes(id)
	if err != nil {
		return fmt.Sprintf("token_id:%d", id)
	}
	return tokenizer.ValidUTF8(b)
}

func versionsOf(toks []engine.Token) []int64 {
	v := make([]int64, len(toks))
	for i, t := range toks {
		v[i] = t.WeightVersion
	}
	return v
}

func idsOf(toks []engine.Token) []int {
	v := make([]int, len(toks))
	for i, t := range toks {
		v[i] = t.ID
	}
	return v
}

func logprobsOf(toks []engine.Token) protocol.Logprobs {
	v := make(protocol.Logprobs, len(toks))
	for i, t := range toks {
		v[i] = protocol.Logprob(t.Logprob)
	}
	return v
}

// responseVersion is the newest weight version any token was produced with, or the serving
// version when there are no tokens.
func (a *API) responseVersion(chs []*choice) int64 {
	v := int64(-1)
	for _, ch := range chs {
		for _, t := range ch.tokens {
			v = max(v, t.WeightVersion)
		}
	}
	if v < 0 {
		return a.eng.Version()
	}
	return v
}

// start validates spec and submits it; on failure it has written the error response.
func (a *API) start(c *gin.Context, spec genSpec) (*genRun, bool) {
	if err := a.prepare(&spec); err != nil {
		writeError(c, err)
		return nil, false
	}
	run, err := a.submit(c.Request.Context(), spec)
	if err != nil {
		writeError(c, err)
		return nil, false
	}
	return run, true
}
