package server_test

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/api"
)

func TestValidationTable(t *testing.T) {
	ts := start(t, func(c *server.Config) { c.APIKey, c.AdminToken, c.MaxBodyBytes = "key", "adm", 64<<10 })
	uri2, _ := writeCheckpoint(t, 2)
	long := make([]int, 2100)
	for i := range long {
		long[i] = i % 256
	}
	longJSON, _ := json.Marshal(map[string]any{"prompt": long})
	const (
		gen = "key"
		adm = "adm"
	)
	// open is a second server started without an admin token: it generated one, and its admin
	// routes answer no TCP client without it, whatever its address and headers.
	open := start(t, func(c *server.Config) { c.MaxBodyBytes = 64 << 10 })
	type tc struct {
		name, method, path, token string
		body                      any
		status                    int
		typ                       string
		// param, when set, is the field the error must name.
		param string
		// hdr are extra headers ("Content-Type" replaces application/json); tokenless sends
		// the request to the server without an admin token.
		hdr       map[string]string
		tokenless bool
	}
	inv := "invalid_request_error"
	auth := "authentication_error"
	many := func(k int) string { return `["` + strings.Repeat(`a","`, k-1) + `a"]` }
	huge := strings.Repeat("a", 60<<10)
	cases := []tc{
		// Integer overflow of n × prompts: a product that wraps negative, or to a small number.
		{name: "n wraps negative", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":[[65],[66]],"n":4611686018427387905}`, status: 400, typ: inv, param: "n"},
		{name: "n wraps to 4", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":[[65],[66],[67],[68]],"n":4611686018427387905}`, status: 400, typ: inv, param: "n"},
		{name: "n max int", method: "POST", path: "/generate", token: gen, body: `{"prompt_token_ids":[1],"n":9223372036854775807}`, status: 400, typ: inv, param: "n"},
		{name: "n beyond int64", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","n":9223372036854775808}`, status: 400, typ: inv, param: "n"},
		{name: "n fractional", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","n":1.5}`, status: 400, typ: inv, param: "n"},
		{name: "too many prompts", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":` + many(65) + `}`, status: 400, typ: inv, param: "prompt"},
		{name: "n times prompts", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":` + many(9) + `,"n":8}`, status: 400, typ: inv, param: "prompt"},
		{name: "chat n huge", method: "POST", path: "/v1/chat/completions", token: gen, body: `{"messages":[{"role":"user","content":"x"}],"n":4611686018427387905}`, status: 400, typ: inv, param: "n"},
		// len(prompt) + max_tokens overflow, and integers that do not fit.
		{name: "max_tokens max int", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","max_tokens":9223372036854775807}`, status: 400, typ: inv, param: "max_tokens"},
		{name: "max_tokens max int minus 1", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":[1,2,3],"max_tokens":9223372036854775806}`, status: 400, typ: inv, param: "max_tokens"},
		{name: "max_tokens beyond int64", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","max_tokens":9223372036854775808}`, status: 400, typ: inv, param: "max_tokens"},
		{name: "generate max_tokens max int", method: "POST", path: "/generate", token: gen, body: `{"prompt_token_ids":[1],"sampling":{"max_tokens":9223372036854775807}}`, status: 400, typ: inv, param: "max_tokens"},
		{name: "generate max_tokens beyond int64", method: "POST", path: "/generate", token: gen, body: `{"prompt_token_ids":[1],"sampling":{"max_tokens":1e19}}`, status: 400, typ: inv, param: "sampling.max_tokens"},
		{name: "chat max_completion_tokens max int", method: "POST", path: "/v1/chat/completions", token: gen, body: `{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":9223372036854775807}`, status: 400, typ: inv, param: "max_tokens"},
		{name: "min_tokens beyond int64", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","min_tokens":1e20}`, status: 400, typ: inv, param: "min_tokens"},
		{name: "top_k beyond int64", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","top_k":9223372036854775808}`, status: 400, typ: inv, param: "top_k"},
		{name: "top_k min int", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","top_k":-9223372036854775808}`, status: 400, typ: inv, param: "top_k"},
		{name: "seed beyond int64", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","seed":1e30}`, status: 400, typ: inv, param: "seed"},
		{name: "logprobs beyond int64", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","logprobs":1e30}`, status: 400, typ: inv, param: "logprobs"},
		{name: "logprobs max int", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","logprobs":9223372036854775807}`, status: 400, typ: inv, param: "logprobs"},
		{name: "stop_token_ids beyond int64", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","stop_token_ids":[1e30]}`, status: 400, typ: inv, param: "stop_token_ids"},
		{name: "token id beyond int64", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":[99999999999999999999]}`, status: 400, typ: inv, param: "prompt"},
		{name: "detokenize id beyond int64", method: "POST", path: "/detokenize", token: gen, body: `{"tokens":[1e30]}`, status: 400, typ: inv, param: "tokens"},
		{name: "min_version negative", method: "POST", path: "/generate", token: gen, body: `{"prompt_token_ids":[1],"min_version":-1}`, status: 400, typ: inv, param: "min_version"},
		{name: "min_version beyond int64", method: "POST", path: "/generate", token: gen, body: `{"prompt_token_ids":[1],"min_version":1e30}`, status: 400, typ: inv, param: "min_version"},
		// Prompt bytes bounded before encoding.
		{name: "prompt bytes beyond the context", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"` + huge + `"}`, status: 400, typ: inv, param: "prompt"},
		{name: "chat content beyond the context", method: "POST", path: "/v1/chat/completions", token: gen, body: `{"messages":[{"role":"user","content":"` + huge + `"}]}`, status: 400, typ: inv},
		{name: "tokenize beyond the context", method: "POST", path: "/tokenize", token: gen, body: `{"prompt":"` + huge + `"}`, status: 400, typ: inv, param: "prompt"},
		// Weight versions.
		{name: "update version max int", method: "POST", path: "/update_weights", token: adm, body: map[string]any{"version": int64(math.MaxInt64), "source": uri2}, status: 400, typ: inv, param: "version"},
		{name: "update version past the step", method: "POST", path: "/update_weights", token: adm, body: map[string]any{"version": 2 + api.MaxVersionStep, "source": uri2}, status: 400, typ: inv, param: "version"},
		{name: "update version far ahead", method: "POST", path: "/update_weights", token: adm, body: map[string]any{"version": int64(1) << 40, "source": uri2}, status: 400, typ: inv, param: "version"},
		{name: "update version beyond int64", method: "POST", path: "/update_weights", token: adm, body: `{"version":1e30,"source":"x"}`, status: 400, typ: inv, param: "version"},
		{name: "update version negative", method: "POST", path: "/update_weights", token: adm, body: map[string]any{"version": -5, "source": uri2}, status: 400, typ: inv, param: "version"},
		// Admin bodies must be JSON; cross-site requests are refused.
		{name: "update as text/plain", method: "POST", path: "/update_weights", token: adm, body: map[string]any{"version": 2, "source": uri2}, status: 415, typ: inv, hdr: map[string]string{"Content-Type": "text/plain"}},
		{name: "update as a form", method: "POST", path: "/update_weights", token: adm, body: `version=2`, status: 415, typ: inv, hdr: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}},
		{name: "abort without content type", method: "POST", path: "/abort_requests", token: adm, body: `{"request_ids":[]}`, status: 415, typ: inv, hdr: map[string]string{"Content-Type": ""}},
		{name: "pause cross-site", method: "POST", path: "/pause", token: adm, status: 403, typ: auth, hdr: map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"}},
		{name: "update cross-origin", method: "POST", path: "/update_weights", token: adm, body: map[string]any{"version": 2, "source": uri2}, status: 403, typ: auth, hdr: map[string]string{"Origin": "http://evil.example"}},
		// No tokenless admin over TCP, not even from loopback with clean headers.
		{name: "tokenless direct loopback", method: "POST", path: "/pause", status: 401, typ: auth, tokenless: true},
		{name: "tokenless direct update", method: "POST", path: "/update_weights", body: map[string]any{"version": 2, "source": uri2}, status: 401, typ: auth, tokenless: true},
		{name: "tokenless X-Forwarded-For", method: "POST", path: "/pause", status: 401, typ: auth, tokenless: true, hdr: map[string]string{"X-Forwarded-For": "203.0.113.9"}},
		{name: "tokenless Forwarded", method: "GET", path: "/state", status: 401, typ: auth, tokenless: true, hdr: map[string]string{"Forwarded": "for=203.0.113.9"}},
		{name: "tokenless X-Real-IP", method: "POST", path: "/sleep", status: 401, typ: auth, tokenless: true, hdr: map[string]string{"X-Real-IP": "203.0.113.9"}},
		{name: "tokenless Via", method: "POST", path: "/update_weights", body: map[string]any{"version": 2, "source": uri2}, status: 401, typ: auth, tokenless: true, hdr: map[string]string{"Via": "1.1 proxy"}},
		{name: "tokenless rebound Host", method: "POST", path: "/update_weights", body: map[string]any{"version": 2, "source": uri2}, status: 401, typ: auth, tokenless: true, hdr: map[string]string{"Host": "attacker.example"}},
		{name: "tokenless Host with another port", method: "POST", path: "/pause", status: 401, typ: auth, tokenless: true, hdr: map[string]string{"Host": "127.0.0.1:1"}},
		{name: "tokenless cross-site", method: "POST", path: "/pause", status: 403, typ: auth, tokenless: true, hdr: map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{name: "tokenless text/plain", method: "POST", path: "/update_weights", body: map[string]any{"version": 2, "source": uri2}, status: 401, typ: auth, tokenless: true, hdr: map[string]string{"Content-Type": "text/plain"}},
		// Unknown routes do not echo the path.
		{name: "unknown route with markup", method: "GET", path: "/%3Cscript%3E", token: gen, status: 404, typ: "not_found_error"},
		{name: "malformed json", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":`, status: 400, typ: inv},
		{name: "not an object", method: "POST", path: "/v1/completions", token: gen, body: `[1,2]`, status: 400, typ: inv},
		{name: "empty body", method: "POST", path: "/v1/completions", token: gen, body: ``, status: 400, typ: inv},
		{name: "trailing data", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a"} x`, status: 400, typ: inv},
		{name: "prompt wrong type", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":5}`, status: 400, typ: inv},
		{name: "prompt list of bools", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":[true]}`, status: 400, typ: inv},
		{name: "missing prompt", method: "POST", path: "/v1/completions", token: gen, body: `{"max_tokens":3}`, status: 400, typ: inv},
		{name: "max_tokens string", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","max_tokens":"ten"}`, status: 400, typ: inv},
		{name: "temperature bool", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","temperature":true}`, status: 400, typ: inv},
		{name: "seed string", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","seed":"x"}`, status: 400, typ: inv},
		{name: "unknown model", method: "POST", path: "/v1/completions", token: gen, body: `{"model":"gpt-9","prompt":"a"}`, status: 404, typ: "not_found_error"},
		{name: "negative max_tokens", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","max_tokens":-3}`, status: 400, typ: inv},
		{name: "huge max_tokens", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","max_tokens":1000000000}`, status: 400, typ: inv},
		{name: "max_tokens overflow", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","max_tokens":1e30}`, status: 400, typ: inv},
		{name: "prompt too long", method: "POST", path: "/v1/completions", token: gen, body: string(longJSON), status: 400, typ: inv},
		{name: "empty prompt", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":""}`, status: 400, typ: inv},
		{name: "empty prompt list", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":[]}`, status: 400, typ: inv},
		{name: "empty token list", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":[[]]}`, status: 400, typ: inv},
		{name: "negative temperature", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","temperature":-1}`, status: 400, typ: inv},
		{name: "huge temperature", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","temperature":1000}`, status: 400, typ: inv},
		{name: "top_p above 1", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","top_p":1.5}`, status: 400, typ: inv},
		{name: "negative top_p", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","top_p":-0.5}`, status: 400, typ: inv},
		{name: "bad top_k", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","top_k":-5}`, status: 400, typ: inv},
		{name: "bad min_p", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","min_p":2}`, status: 400, typ: inv},
		{name: "n zero", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","n":0}`, status: 400, typ: inv},
		{name: "n negative", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","n":-1}`, status: 400, typ: inv},
		{name: "too many n", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","n":1000}`, status: 400, typ: inv},
		{name: "logprobs too many", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","logprobs":50}`, status: 400, typ: inv},
		{name: "logprobs negative", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","logprobs":-1}`, status: 400, typ: inv},
		{name: "bad logprob_mode", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","logprob_mode":"weird"}`, status: 400, typ: inv},
		{name: "token id beyond vocab", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":[256,9999]}`, status: 400, typ: inv},
		{name: "negative token id", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":[-1]}`, status: 400, typ: inv},
		{name: "invalid utf-8", method: "POST", path: "/v1/completions", token: gen, body: []byte("{\"prompt\":\"a\xff\xfe\"}"), status: 400, typ: inv},
		{name: "oversized body", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"` + strings.Repeat("a", 70<<10) + `"}`, status: 413, typ: inv},
		{name: "stop wrong type", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","stop":5}`, status: 400, typ: inv},
		{name: "empty stop string", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","stop":[""]}`, status: 400, typ: inv},
		{name: "stop_token_ids beyond vocab", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","stop_token_ids":[100000]}`, status: 400, typ: inv},
		{name: "min_tokens above max_tokens", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","max_tokens":2,"min_tokens":5}`, status: 400, typ: inv},
		{name: "bad param with stream", method: "POST", path: "/v1/completions", token: gen, body: `{"prompt":"a","stream":true,"temperature":-2}`, status: 400, typ: inv},
		{name: "missing api key", method: "POST", path: "/v1/completions", token: "-", body: `{"prompt":"a"}`, status: 401, typ: "authentication_error"},
		{name: "wrong api key", method: "POST", path: "/v1/completions", token: "nope", body: `{"prompt":"a"}`, status: 401, typ: "authentication_error"},
		{name: "chat empty messages", method: "POST", path: "/v1/chat/completions", token: gen, body: `{"messages":[]}`, status: 400, typ: inv},
		{name: "chat bad role", method: "POST", path: "/v1/chat/completions", token: gen, body: `{"messages":[{"role":"robot","content":"x"}]}`, status: 400, typ: inv},
		{name: "chat content number", method: "POST", path: "/v1/chat/completions", token: gen, body: `{"messages":[{"role":"user","content":5}]}`, status: 400, typ: inv},
		{name: "chat image part", method: "POST", path: "/v1/chat/completions", token: gen, body: `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, status: 400, typ: inv},
		{name: "chat top_logprobs too many", method: "POST", path: "/v1/chat/completions", token: gen, body: `{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":99}`, status: 400, typ: inv},
		{name: "generate missing prompt", method: "POST", path: "/generate", token: gen, body: `{"sampling":{}}`, status: 400, typ: inv},
		{name: "generate sampling wrong type", method: "POST", path: "/generate", token: gen, body: `{"prompt_token_ids":[1],"sampling":3}`, status: 400, typ: inv},
		{name: "generate n zero", method: "POST", path: "/generate", token: gen, body: `{"prompt_token_ids":[1],"n":0}`, status: 400, typ: inv},
		{name: "generate bad token", method: "POST", path: "/generate", token: gen, body: `{"prompt_token_ids":[1,300]}`, status: 400, typ: inv},
		{name: "generate stale min_version", method: "POST", path: "/generate", token: gen, body: `{"prompt_token_ids":[1],"min_version":99}`, status: 409, typ: "conflict_error"},
		{name: "detokenize bad token", method: "POST", path: "/detokenize", token: gen, body: `{"tokens":[-4]}`, status: 400, typ: inv},
		{name: "tokenize nothing", method: "POST", path: "/tokenize", token: gen, body: `{}`, status: 400, typ: inv},
		{name: "pause bad mode", method: "POST", path: "/pause?mode=bogus", token: adm, body: nil, status: 400, typ: inv},
		{name: "pause bad clear_cache", method: "POST", path: "/pause?clear_cache=maybe", token: adm, body: nil, status: 400, typ: inv},
		{name: "sleep level 7", method: "POST", path: "/sleep?level=7", token: adm, body: nil, status: 400, typ: inv},
		{name: "sleep level abc", method: "POST", path: "/sleep?level=abc", token: adm, body: nil, status: 400, typ: inv},
		{name: "sleep bad mode", method: "POST", path: "/sleep?level=1&mode=later", token: adm, body: nil, status: 400, typ: inv},
		{name: "wake_up bad tag", method: "POST", path: "/wake_up?tags=gpu", token: adm, body: nil, status: 400, typ: inv},
		{name: "reset bad bool", method: "POST", path: "/reset_prefix_cache?reset_external=yesplease", token: adm, body: nil, status: 400, typ: inv},
		{name: "admin missing token", method: "POST", path: "/pause", token: "-", body: nil, status: 401, typ: "authentication_error"},
		{name: "admin with api key", method: "GET", path: "/state", token: gen, body: nil, status: 401, typ: "authentication_error"},
		{name: "update digest mismatch", method: "POST", path: "/update_weights", token: adm, body: map[string]any{"version": 2, "source": uri2, "sha256": strings.Repeat("ab", 32)}, status: 422, typ: inv},
		{name: "update missing file", method: "POST", path: "/update_weights", token: adm, body: map[string]any{"version": 2, "source": "file:///does/not/exist"}, status: 404, typ: "not_found_error"},
		{name: "update bad scheme", method: "POST", path: "/update_weights", token: adm, body: map[string]any{"version": 2, "source": "ftp://x/y"}, status: 400, typ: inv},
		{name: "update bad sha", method: "POST", path: "/update_weights", token: adm, body: map[string]any{"version": 2, "source": uri2, "sha256": "xyz"}, status: 400, typ: inv},
		{name: "update version zero", method: "POST", path: "/update_weights", token: adm, body: map[string]any{"source": uri2}, status: 400, typ: inv},
		{name: "update stale version", method: "POST", path: "/update_weights", token: adm, body: map[string]any{"version": 1, "source": uri2}, status: 409, typ: "conflict_error"},
		{name: "update nothing staged", method: "POST", path: "/update_weights", token: adm, body: map[string]any{"version": 2}, status: 409, typ: "conflict_error"},
		{name: "update malformed", method: "POST", path: "/update_weights", token: adm, body: `{"version":`, status: 400, typ: inv},
		{name: "update http without sha256", method: "POST", path: "/update_weights", token: adm, body: map[string]any{"version": 2, "source": "http://127.0.0.1:1/ckpt"}, status: 400, typ: inv},
		{name: "update unreachable http", method: "POST", path: "/update_weights", token: adm, body: map[string]any{"version": 2, "source": "http://127.0.0.1:1/ckpt", "sha256": strings.Repeat("ab", 32)}, status: 422, typ: inv},
		{name: "abort bad body", method: "POST", path: "/abort_requests", token: adm, body: `{"request_ids":5}`, status: 400, typ: inv},
		{name: "wrong method", method: "GET", path: "/v1/completions", token: gen, body: nil, status: 405, typ: inv},
		{name: "unknown route", method: "GET", path: "/v2/nothing", token: gen, body: nil, status: 404, typ: "not_found_error"},
	}
	require.GreaterOrEqual(t, len(cases), 60)
	good := `{"prompt":"ok","max_tokens":2}`
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv, admTok, tok := ts, adm, c.token
			if c.tokenless {
				srv, admTok, tok = open, "", "-"
			}
			code, out := srv.send(t, c.method, c.path, tok, c.body, c.hdr)
			assert.Equal(t, c.status, code, "%s", out)
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Code    any     `json:"code"`
					Param   *string `json:"param"`
				} `json:"error"`
			}
			if assert.NoError(t, json.Unmarshal(out, &e), "error body is JSON: %s", out) {
				assert.NotEmpty(t, e.Error.Message)
				assert.NotNil(t, e.Error.Code, "%s", out)
				assert.Equal(t, c.typ, e.Error.Type, "%s", out)
				if c.param != "" && assert.NotNil(t, e.Error.Param, "%s", out) {
					assert.Equal(t, c.param, *e.Error.Param, "%s", out)
				}
				// No Go internals in what the client sees.
				assert.NotContains(t, string(out), "Params.", "%s", out)
				assert.NotContains(t, string(out), "<script>", "%s", out)
			}
			// The server still serves, with the old weights, and nothing is left queued.
			code, out = srv.do(t, "POST", "/v1/completions", gen, good)
			require.Equal(t, http.StatusOK, code, "good request after %q: %s", c.name, out)
			var r struct {
				WeightVersion int64 `json:"weight_version"`
			}
			require.NoError(t, json.Unmarshal(out, &r))
			assert.EqualValues(t, 1, r.WeightVersion, fmt.Sprintf("after %q", c.name))
			code, out = srv.do(t, "GET", "/state", admTok, nil)
			require.Equal(t, http.StatusOK, code, "%s", out)
			var st stateResp
			require.NoError(t, json.Unmarshal(out, &st))
			assert.EqualValues(t, "running", st.State)
			assert.EqualValues(t, 1, st.WeightVersion)
			assert.Zero(t, st.StagedVersion)
			assert.Zero(t, st.RequestsRunning+st.RequestsWaiting, "engine requests left after %q", c.name)
			assert.Zero(t, st.HTTPInflight+st.HTTPQueued, "HTTP requests left after %q", c.name)
		})
	}
	// Nothing leaked.
	code, out := ts.do(t, "GET", "/state", adm, nil)
	require.Equal(t, 200, code)
	var st stateResp
	require.NoError(t, json.Unmarshal(out, &st))
	assert.Zero(t, st.KVBlocksUsed)
	assert.EqualValues(t, "running", st.State)
}
