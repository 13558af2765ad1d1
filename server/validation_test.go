package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/server"
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
	type tc struct {
		name, method, path, token string
		body                      any
		status                    int
		typ                       string
	}
	inv := "invalid_request_error"
	cases := []tc{
		{"malformed json", "POST", "/v1/completions", gen, `{"prompt":`, 400, inv},
		{"not an object", "POST", "/v1/completions", gen, `[1,2]`, 400, inv},
		{"empty body", "POST", "/v1/completions", gen, ``, 400, inv},
		{"trailing data", "POST", "/v1/completions", gen, `{"prompt":"a"} x`, 400, inv},
		{"prompt wrong type", "POST", "/v1/completions", gen, `{"prompt":5}`, 400, inv},
		{"prompt list of bools", "POST", "/v1/completions", gen, `{"prompt":[true]}`, 400, inv},
		{"missing prompt", "POST", "/v1/completions", gen, `{"max_tokens":3}`, 400, inv},
		{"max_tokens string", "POST", "/v1/completions", gen, `{"prompt":"a","max_tokens":"ten"}`, 400, inv},
		{"temperature bool", "POST", "/v1/completions", gen, `{"prompt":"a","temperature":true}`, 400, inv},
		{"seed string", "POST", "/v1/completions", gen, `{"prompt":"a","seed":"x"}`, 400, inv},
		{"unknown model", "POST", "/v1/completions", gen, `{"model":"gpt-9","prompt":"a"}`, 404, "not_found_error"},
		{"negative max_tokens", "POST", "/v1/completions", gen, `{"prompt":"a","max_tokens":-3}`, 400, inv},
		{"huge max_tokens", "POST", "/v1/completions", gen, `{"prompt":"a","max_tokens":1000000000}`, 400, inv},
		{"max_tokens overflow", "POST", "/v1/completions", gen, `{"prompt":"a","max_tokens":1e30}`, 400, inv},
		{"prompt too long", "POST", "/v1/completions", gen, string(longJSON), 400, inv},
		{"empty prompt", "POST", "/v1/completions", gen, `{"prompt":""}`, 400, inv},
		{"empty prompt list", "POST", "/v1/completions", gen, `{"prompt":[]}`, 400, inv},
		{"empty token list", "POST", "/v1/completions", gen, `{"prompt":[[]]}`, 400, inv},
		{"negative temperature", "POST", "/v1/completions", gen, `{"prompt":"a","temperature":-1}`, 400, inv},
		{"huge temperature", "POST", "/v1/completions", gen, `{"prompt":"a","temperature":1000}`, 400, inv},
		{"top_p above 1", "POST", "/v1/completions", gen, `{"prompt":"a","top_p":1.5}`, 400, inv},
		{"negative top_p", "POST", "/v1/completions", gen, `{"prompt":"a","top_p":-0.5}`, 400, inv},
		{"bad top_k", "POST", "/v1/completions", gen, `{"prompt":"a","top_k":-5}`, 400, inv},
		{"bad min_p", "POST", "/v1/completions", gen, `{"prompt":"a","min_p":2}`, 400, inv},
		{"n zero", "POST", "/v1/completions", gen, `{"prompt":"a","n":0}`, 400, inv},
		{"n negative", "POST", "/v1/completions", gen, `{"prompt":"a","n":-1}`, 400, inv},
		{"too many n", "POST", "/v1/completions", gen, `{"prompt":"a","n":1000}`, 400, inv},
		{"logprobs too many", "POST", "/v1/completions", gen, `{"prompt":"a","logprobs":50}`, 400, inv},
		{"logprobs negative", "POST", "/v1/completions", gen, `{"prompt":"a","logprobs":-1}`, 400, inv},
		{"bad logprob_mode", "POST", "/v1/completions", gen, `{"prompt":"a","logprob_mode":"weird"}`, 400, inv},
		{"token id beyond vocab", "POST", "/v1/completions", gen, `{"prompt":[256,9999]}`, 400, inv},
		{"negative token id", "POST", "/v1/completions", gen, `{"prompt":[-1]}`, 400, inv},
		{"invalid utf-8", "POST", "/v1/completions", gen, []byte("{\"prompt\":\"a\xff\xfe\"}"), 400, inv},
		{"oversized body", "POST", "/v1/completions", gen, `{"prompt":"` + strings.Repeat("a", 70<<10) + `"}`, 413, inv},
		{"stop wrong type", "POST", "/v1/completions", gen, `{"prompt":"a","stop":5}`, 400, inv},
		{"empty stop string", "POST", "/v1/completions", gen, `{"prompt":"a","stop":[""]}`, 400, inv},
		{"stop_token_ids beyond vocab", "POST", "/v1/completions", gen, `{"prompt":"a","stop_token_ids":[100000]}`, 400, inv},
		{"min_tokens above max_tokens", "POST", "/v1/completions", gen, `{"prompt":"a","max_tokens":2,"min_tokens":5}`, 400, inv},
		{"bad param with stream", "POST", "/v1/completions", gen, `{"prompt":"a","stream":true,"temperature":-2}`, 400, inv},
		{"missing api key", "POST", "/v1/completions", "", `{"prompt":"a"}`, 401, "authentication_error"},
		{"wrong api key", "POST", "/v1/completions", "nope", `{"prompt":"a"}`, 401, "authentication_error"},
		{"chat empty messages", "POST", "/v1/chat/completions", gen, `{"messages":[]}`, 400, inv},
		{"chat bad role", "POST", "/v1/chat/completions", gen, `{"messages":[{"role":"robot","content":"x"}]}`, 400, inv},
		{"chat content number", "POST", "/v1/chat/completions", gen, `{"messages":[{"role":"user","content":5}]}`, 400, inv},
		{"chat image part", "POST", "/v1/chat/completions", gen, `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400, inv},
		{"chat top_logprobs too many", "POST", "/v1/chat/completions", gen, `{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":99}`, 400, inv},
		{"generate missing prompt", "POST", "/generate", gen, `{"sampling":{}}`, 400, inv},
		{"generate sampling wrong type", "POST", "/generate", gen, `{"prompt_token_ids":[1],"sampling":3}`, 400, inv},
		{"generate n zero", "POST", "/generate", gen, `{"prompt_token_ids":[1],"n":0}`, 400, inv},
		{"generate bad token", "POST", "/generate", gen, `{"prompt_token_ids":[1,300]}`, 400, inv},
		{"generate stale min_version", "POST", "/generate", gen, `{"prompt_token_ids":[1],"min_version":99}`, 409, "conflict_error"},
		{"detokenize bad token", "POST", "/detokenize", gen, `{"tokens":[-4]}`, 400, inv},
		{"tokenize nothing", "POST", "/tokenize", gen, `{}`, 400, inv},
		{"pause bad mode", "POST", "/pause?mode=bogus", adm, nil, 400, inv},
		{"pause bad clear_cache", "POST", "/pause?clear_cache=maybe", adm, nil, 400, inv},
		{"sleep level 7", "POST", "/sleep?level=7", adm, nil, 400, inv},
		{"sleep level abc", "POST", "/sleep?level=abc", adm, nil, 400, inv},
		{"sleep bad mode", "POST", "/sleep?level=1&mode=later", adm, nil, 400, inv},
		{"wake_up bad tag", "POST", "/wake_up?tags=gpu", adm, nil, 400, inv},
		{"reset bad bool", "POST", "/reset_prefix_cache?reset_external=yesplease", adm, nil, 400, inv},
		{"admin missing token", "POST", "/pause", "", nil, 401, "authentication_error"},
		{"admin with api key", "GET", "/state", gen, nil, 401, "authentication_error"},
		{"update digest mismatch", "POST", "/update_weights", adm, map[string]any{"version": 2, "source": uri2, "sha256": strings.Repeat("ab", 32)}, 422, inv},
		{"update missing file", "POST", "/update_weights", adm, map[string]any{"version": 2, "source": "file:///does/not/exist"}, 404, "not_found_error"},
		{"update bad scheme", "POST", "/update_weights", adm, map[string]any{"version": 2, "source": "ftp://x/y"}, 400, inv},
		{"update bad sha", "POST", "/update_weights", adm, map[string]any{"version": 2, "source": uri2, "sha256": "xyz"}, 400, inv},
		{"update version zero", "POST", "/update_weights", adm, map[string]any{"source": uri2}, 400, inv},
		{"update stale version", "POST", "/update_weights", adm, map[string]any{"version": 1, "source": uri2}, 409, "conflict_error"},
		{"update nothing staged", "POST", "/update_weights", adm, map[string]any{"version": 2}, 409, "conflict_error"},
		{"update malformed", "POST", "/update_weights", adm, `{"version":`, 400, inv},
		{"update http without sha256", "POST", "/update_weights", adm, map[string]any{"version": 2, "source": "http://127.0.0.1:1/ckpt"}, 400, inv},
		{"update unreachable http", "POST", "/update_weights", adm, map[string]any{"version": 2, "source": "http://127.0.0.1:1/ckpt", "sha256": strings.Repeat("ab", 32)}, 422, inv},
		{"abort bad body", "POST", "/abort_requests", adm, `{"request_ids":5}`, 400, inv},
		{"wrong method", "GET", "/v1/completions", gen, nil, 405, inv},
		{"unknown route", "GET", "/v2/nothing", gen, nil, 404, "not_found_error"},
	}
	require.GreaterOrEqual(t, len(cases), 40)
	good := `{"prompt":"ok","max_tokens":2}`
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out := ts.do(t, c.method, c.path, c.token, c.body)
			assert.Equal(t, c.status, code, "%s", out)
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			if assert.NoError(t, json.Unmarshal(out, &e), "error body is JSON: %s", out) {
				assert.NotEmpty(t, e.Error.Message)
				assert.Equal(t, c.typ, e.Error.Type, "%s", out)
			}
			// The server still serves, with the old weights.
			code, out = ts.do(t, "POST", "/v1/completions", gen, good)
			require.Equal(t, http.StatusOK, code, "good request after %q: %s", c.name, out)
			var r struct {
				WeightVersion int64 `json:"weight_version"`
			}
			require.NoError(t, json.Unmarshal(out, &r))
			assert.EqualValues(t, 1, r.WeightVersion, fmt.Sprintf("after %q", c.name))
		})
	}
	// Nothing leaked.
	code, out := ts.do(t, "GET", "/state", adm, nil)
	require.Equal(t, 200, code)
	var st stateResp
	require.NoError(t, json.Unmarshal(out, &st))
	assert.Zero(t, st.KVBlocksUsed)
	assert.Equal(t, "running", st.State)
}
