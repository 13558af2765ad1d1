// Package api is the HTTP surface of a rollout server (gin): the OpenAI-compatible routes
// (/v1/completions, /v1/chat/completions, /v1/models), the native token-level routes for RL
// (/generate, /tokenize, /detokenize), the admin plane (/pause, /resume, /sleep, /wake_up,
// /reset_prefix_cache, /update_weights, /abort_requests, /state, ...), the probes (/health,
// /ready, /version) and /metrics. The contract is docs/http-api.md; this comment records the choices
// it leaves open.
//
// Usage:
//
//	m := api.NewMetrics()
//	e, _ := engine.New(engine.Config{Weights: w, Hooks: m.Hooks()})
//	go e.Run(ctx)
//	a, _ := api.New(api.Config{Engine: e, Tokenizer: tok, ModelConfig: w.Config, Metrics: m})
//	srv := &http.Server{Handler: a.Handler()}
//
// Choices:
//   - Text prompts (completions, chat, /tokenize) get the vocabulary's BOS first, as
//     `rollout generate` does, so greedy output over HTTP equals the in-process output.
//     Token-id prompts are used as given.
//   - Chat (/v1/chat/completions, and /tokenize with messages) renders the checkpoint's Jinja
//     chat template (tokenizer_config.json chat_template, or chat_template.jinja) as
//     transformers' apply_chat_template(add_generation_prompt=True) does: variables messages
//     (role; content as a string, text parts joined), add_generation_prompt=true, bos_token,
//     eos_token, tools and documents none; trim_blocks and lstrip_blocks on. With no template
//     it is a built-in ChatML ("developer" rendered as "system"). The template is compiled
//     once at startup and a template that does not compile stops the server; an error while
//     rendering (e.g. raise_exception on roles that do not alternate) is a 400 on "messages".
//   - A rendered chat that starts with bos_token gets no second BOS: that text becomes the
//     BOS id (as HF/vLLM tokenize it without adding special tokens). Other special-token
//     text the template emits is matched like any prompt text: added tokens such as
//     <|eot_id|> or <|im_end|> become their ids, but BOS/EOS/PAD are control tokens that text
//     never spells (see package tokenizer), so an eos_token inside the rendering (Llama-2,
//     Mistral, Zephyr after an assistant turn) is tokenized as text, not as the EOS id.
//   - Logprobs are the engine's (raw log-softmax by default; "logprob_mode":"processed" for the
//     sampled distribution). A processed-mode logprob of a token outside the kept set is -Inf,
//     which JSON cannot carry: it is encoded as null.
//   - "logprobs": 0 on /v1/completions returns the sampled tokens' logprobs without top
//     alternatives; an omitted field returns none. With echo, only the text is echoed (no
//     prompt logprobs).
//   - Stop strings are applied to the decoded text here (the engine stops on token ids):
//     the matched string is not included, the engine request is aborted at once, and the
//     finish reason is "stop". Streaming holds back text that may still become a stop string.
//   - Per-choice "weight_versions" (one per generated token) are always present; the
//     response's "weight_version" is the newest version any of its tokens was produced with
//     (the serving version when none was generated). "finish_reason" may be "abort" (a pause
//     with mode=abort, /abort_requests, shutdown).
//   - With n > 1 and a seed, sample i uses seed+i. Engine request ids are the server's own
//     ("r-...", "-<k>" for the k-th sequence of a multi-sequence request): a client's
//     request_id is echoed and names the request for /abort_requests, but two clients that
//     choose the same one do not collide.
//   - /generate with min_version above the serving version answers 409 (code stale_version).
//   - Admin routes need the admin token over TCP, from any address (401
//     admin_token_required); without one configured, only a unix-socket peer is admitted.
//     On a fleet member (FleetManaged) the routes that change weights or run state answer
//     403 fleet_managed. Every admin route refuses cross-origin browser requests (403) and
//     bodies not sent as application/json (415).
//   - /update_weights: file:// and http(s):// sources (file sources confined to the weights
//     root when one is set, refused with NoFileWeights), one deadline for the whole fetch and
//     load (504 fetch_timeout), SHA-256 verified while parsing; http(s) sources need a sha256
//     unless AllowUnverifiedWeights. A bad ref or scheme is 400, a missing file 404, a
//     digest mismatch, unreadable or refused source, bad checkpoint or wrong shape 422, a
//     version not newer than the serving one 409, one more than MaxVersionStep ahead 400;
//     in every case the old weights keep serving (and /ready stays 200 until the commit).
//     Fetch errors are generic and source URLs redacted. An empty source commits weights
//     staged earlier with stage_only.
//   - Limits: the body is admitted into the memory budget of bodies in flight before a byte
//     is read (MaxBodyBytesInFlight, 503 body_budget_exhausted with Retry-After beyond, left
//     unread), then read (MaxBodyBytes, 413 beyond; BodyReadTimeout, 408), then
//     a slot is taken: MaxConcurrent generation and tokenize requests at once, MaxQueue
//     more waiting, then 429. n and the prompt count are bounded before they multiply, and
//     prompt text too long for the context is refused before it is encoded. Every response
//     write extends a WriteTimeout deadline.
//   - Chat message content is encoded with special tokens disabled: only the template adds
//     special ids.
//   - A client that disconnects aborts its engine requests (blocks are freed at once).
//   - Errors are {"error":{"message","type","code","param"}}; bad input never yields a 500.
package api
