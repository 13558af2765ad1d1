package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/tokenizer"
	"github.com/rolloutkit/rollout/internal/enginetest"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	goleak.VerifyTestMain(m)
}

func TestTextProcStopStrings(t *testing.T) {
	tok := tokenizer.NewByte()
	push := func(p *textProc, s string) (out string, stopped bool) {
		for i := 0; i < len(s); i++ {
			d, st := p.push(int(s[i]))
			out += d
			if st {
				return out, true
			}
		}
		return out + p.flush(), false
	}
	tests := []struct {
		stops       []string
		in, want    string
		wantStopped bool
	}{
		{nil, "hello world", "hello world", false},
		{[]string{"wor"}, "hello world", "hello ", true},
		{[]string{"xyz"}, "hello world", "hello world", false},
		{[]string{"ld", "lo"}, "hello world", "hel", true},
		{[]string{"aab"}, "aaaab", "aa", true},
		{[]string{"end"}, "the en", "the en", false}, // held back, then flushed at the end
	}
	for _, tt := range tests {
		p := newTextProc(tok, tt.stops)
		got, stopped := push(p, tt.in)
		assert.Equal(t, tt.want, got, "%v %q", tt.stops, tt.in)
		assert.Equal(t, tt.wantStopped, stopped)
		assert.Equal(t, tt.want, p.String())
	}
	// Held-back text is released only once it cannot start a stop string.
	p := newTextProc(tok, []string{"abc"})
	d, _ := p.push('x')
	assert.Equal(t, "x", d)
	d, _ = p.push('a')
	assert.Empty(t, d)
	d, _ = p.push('b')
	assert.Empty(t, d)
	d, _ = p.push('z')
	assert.Equal(t, "abz", d)
	// Multi-byte characters split over tokens come out whole.
	p = newTextProc(tok, nil)
	d, _ = p.push(0xc3)
	assert.Empty(t, d)
	d, _ = p.push(0xa9)
	assert.Equal(t, "é", d)
}

func testAPI(t *testing.T, cfg Config) *API {
	t.Helper()
	e, w := enginetest.Run(t, engine.Config{})
	cfg.Engine, cfg.Tokenizer, cfg.ModelConfig = e, tokenizer.NewByte(), w.Config
	a, err := New(cfg)
	require.NoError(t, err)
	return a
}

// TestNoTokenlessAdminOverTCP: without an admin token no TCP client reaches an admin route,
// loopback with clean headers included; a unix-socket client does (its file mode decides).
func TestNoTokenlessAdminOverTCP(t *testing.T) {
	a := testAPI(t, Config{})
	for _, tc := range []struct {
		remote, host string
		local        net.Addr
		want         int
	}{
		{"127.0.0.1:5000", "127.0.0.1:8000", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8000}, 401},
		{"[::1]:5000", "localhost:8000", &net.TCPAddr{IP: net.IPv6loopback, Port: 8000}, 401},
		{"10.1.2.3:5000", "127.0.0.1:8000", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8000}, 401},
		{"@", "admin", &net.UnixAddr{Name: "/run/rollout/admin.sock", Net: "unix"}, 200},
	} {
		req := httptest.NewRequest(http.MethodGet, "/is_paused", nil)
		req.RemoteAddr, req.Host = tc.remote, tc.host
		req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, tc.local))
		w := httptest.NewRecorder()
		a.Handler().ServeHTTP(w, req)
		assert.Equal(t, tc.want, w.Code, "%s via %v: %s", tc.remote, tc.local, w.Body)
		if tc.want == 401 {
			assert.Contains(t, w.Body.String(), "admin_token_required")
		}
	}
	// Generation routes stay open from anywhere when no API key is set.
	req := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
	req.RemoteAddr = "10.1.2.3:5000"
	w := httptest.NewRecorder()
	a.Handler().ServeHTTP(w, req)
	assert.Equal(t, 200, w.Code)
}

func TestAdminTokenAcceptedFromAnywhere(t *testing.T) {
	a := testAPI(t, Config{AdminToken: "s3cret", APIKey: "k"})
	for _, tc := range []struct {
		path, auth string
		want       int
	}{
		{"/is_paused", "Bearer s3cret", 200},
		{"/is_paused", "bearer s3cret", 200},
		{"/is_paused", "Bearer s3cre", 401},
		{"/is_paused", "Basic s3cret", 401},
		{"/is_paused", "", 401},
		{"/v1/models", "Bearer k", 200},
		{"/v1/models", "Bearer s3cret", 401},
		{"/health", "", 200},
		{"/metrics", "", 200},
	} {
		req := httptest.NewRequest(http.MethodGet, tc.path, nil)
		req.RemoteAddr = "10.1.2.3:5000"
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		w := httptest.NewRecorder()
		a.Handler().ServeHTTP(w, req)
		assert.Equal(t, tc.want, w.Code, "%s %q: %s", tc.path, tc.auth, w.Body)
		if w.Code == 401 {
			assert.True(t, strings.Contains(w.Body.String(), `"type":"authentication_error"`), w.Body.String())
		}
	}
}

func TestRenderChatML(t *testing.T) {
	chatML, err := newChatTemplate("", "", "")
	require.NoError(t, err)
	s, err := chatML.render([]chatMessage{{Role: "system", Content: json.RawMessage(`"a"`)},
		{Role: "user", Content: json.RawMessage(`[{"type":"text","text":"b"},{"type":"text","text":"c"}]`)}})
	require.NoError(t, err)
	assert.Equal(t, "<|im_start|>system\na<|im_end|>\n<|im_start|>user\nbc<|im_end|>\n<|im_start|>assistant\n", s)
	assert.True(t, isChatML("{% for m in messages %}<|im_start|>{{m.role}}{% endfor %}"))
	assert.False(t, isChatML("[INST] {{ m }} [/INST]"))
}

// countingTokenizer counts the bytes it was asked to encode.
type countingTokenizer struct {
	tokenizer.Tokenizer
	encoded *int
}

func (c countingTokenizer) Encode(s string) ([]int, error) {
	*c.encoded += len(s)
	return c.Tokenizer.Encode(s)
}

// TestPromptBytesBoundedBeforeEncoding: text too long for the context is refused before the
// tokenizer sees it (its cost grows with the text, the answer does not).
func TestPromptBytesBoundedBeforeEncoding(t *testing.T) {
	a := testAPI(t, Config{})
	encoded := 0
	a.tok = countingTokenizer{Tokenizer: a.tok, encoded: &encoded}
	big := strings.Repeat("a", 4<<20)
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"` + big + `"}`},
		{"/v1/completions", `{"prompt":["a","` + big + `"]}`},
		{"/tokenize", `{"prompt":"` + big + `"}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"` + big + `"}]}`},
	} {
		{
			req := httptest.NewRequest(http.MethodPost, c.path, strings.NewReader(c.body))
			w := httptest.NewRecorder()
			a.Handler().ServeHTTP(w, req)
			assert.Equal(t, http.StatusBadRequest, w.Code, "%s", w.Body.String()[:min(200, w.Body.Len())])
			assert.Contains(t, w.Body.String(), "context_length_exceeded")
		}
	}
	assert.Less(t, encoded, 1<<10, "the oversized text was never encoded")
}

// TestUnknownErrorsAreGeneric: an error the API does not know answers 500 with a generic
// message; its text (paths, internals) stays in the log.
func TestUnknownErrorsAreGeneric(t *testing.T) {
	e := classify(fmt.Errorf("open /srv/secret/state.db: %w", errors.New("boom")))
	assert.Equal(t, http.StatusInternalServerError, e.Status)
	assert.Equal(t, "internal error", e.Message)
	assert.Equal(t, "max_tokens", jsonField("Params.max_tokens"))
	assert.Equal(t, "sampling.max_tokens", jsonField("sampling.max_tokens"))
}

// TestWireNamesMatchTheEngine: the engine's finish reasons are what the protocol names on
// the wire, so the server passes them through and the SDK compares with protocol's constants.
func TestWireNamesMatchTheEngine(t *testing.T) {
	assert.EqualValues(t, protocol.FinishStop, engine.FinishStop)
	assert.EqualValues(t, protocol.FinishLength, engine.FinishLength)
	assert.EqualValues(t, protocol.FinishAbort, engine.FinishAbort)
}

// TestAbortReachesChoicesAddedAfterIt: an /abort_requests that arrives while a request's
// choices are still being added aborts every choice, those the engine takes after the abort
// included. The engine is paused, so nothing runs and nothing can finish before the abort.
func TestAbortReachesChoicesAddedAfterIt(t *testing.T) {
	a := testAPI(t, Config{AdminToken: "s3cret"})
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	post := func(path string, body, out any) error {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, bytes.NewReader(b))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer s3cret")
		req.Header.Set("Content-Type", "application/json")
		resp, err := srv.Client().Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: status %d", path, resp.StatusCode)
		}
		if out == nil {
			return nil
		}
		return json.NewDecoder(resp.Body).Decode(out)
	}
	require.NoError(t, post("/pause?mode=keep", nil, nil))
	var aborted struct {
		Aborted int `json:"aborted"`
	}
	abortErr := make(chan error, 1)
	a.afterAdd = func(k int) {
		if k == 0 {
			abortErr <- post("/abort_requests", map[string]any{"request_ids": []string{"X"}}, &aborted)
		}
	}
	type result struct {
		g   protocol.GenerateResponse
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.err = post("/generate", map[string]any{"prompt_token_ids": []int{1, 2, 3}, "n": 3, "request_id": "X",
			"sampling": map[string]any{"max_tokens": 8, "temperature": 0, "ignore_eos": true}}, &r.g)
		done <- r
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		// Paused, a choice the abort missed never finishes: resume to let it end, and fail.
		t.Error("choices added after the abort are still waiting")
		require.NoError(t, post("/resume", nil, nil))
		r = <-done
	}
	require.NoError(t, r.err)
	require.NoError(t, <-abortErr)
	assert.Equal(t, 3, aborted.Aborted, "the abort names all three choices")
	require.Len(t, r.g.Outputs, 3)
	for i, o := range r.g.Outputs {
		assert.Equal(t, protocol.FinishReason("abort"), o.FinishReason, "choice %d", i)
		assert.Empty(t, o.TokenIDs, "choice %d ran while paused", i)
	}
	require.NoError(t, post("/resume", nil, nil))
}
