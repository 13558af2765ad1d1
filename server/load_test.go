package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/server"
)

// TestLoadWithAdminChurn sends 200 concurrent mixed requests (streaming, n>1, aborts, client
// disconnects) while the admin plane pauses, sleeps, swaps weights and resumes. Every request
// must end with a proper response or error within its deadline, and afterwards nothing is
// left running and no block is held.
func TestLoadWithAdminChurn(t *testing.T) {
	ts := start(t, func(c *server.Config) { c.KVBlocks = 2048 })
	var ckpts [3][2]string
	for i := range ckpts {
		ckpts[i][0], ckpts[i][1] = writeCheckpoint(t, uint64(2+i))
	}
	const total = 200
	var (
		wg       sync.WaitGroup
		finished atomic.Int64
		kinds    sync.Map // outcome → count
	)
	count := func(k string) {
		v, _ := kinds.LoadOrStore(k, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	post := func(ctx context.Context, path, body string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+path, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		return ts.client.Do(req)
	}
	okFinish := func(f string) bool { return f == "stop" || f == "length" || f == "abort" }

	one := func(i int) error {
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		plen := 2 + rng.IntN(40)
		prompt := make([]int, plen)
		prompt[0] = 256
		for k := 1; k < plen; k++ {
			prompt[k] = rng.IntN(256)
		}
		pj, _ := json.Marshal(prompt)
		maxTok := (4 + rng.IntN(60)) / loadTokens
		rctx, rcancel := context.WithTimeout(ctx, 45*time.Second)
		defer rcancel()
		switch i % 5 {
		case 0, 2: // non-streaming: completions (n=1) or /generate (n=3)
			path, body := "/v1/completions", fmt.Sprintf(`{"prompt":%s,"max_tokens":%d,"return_token_ids":true}`, pj, maxTok)
			if i%5 == 2 {
				path, body = "/generate", fmt.Sprintf(`{"prompt_token_ids":%s,"n":3,"sampling":{"max_tokens":%d,"seed":%d}}`, pj, maxTok, i)
			}
			resp, err := post(rctx, path, body)
			if err != nil {
				return fmt.Errorf("request %d: %w", i, err)
			}
			out, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return fmt.Errorf("request %d: reading: %w", i, err)
			}
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("request %d: status %d: %s", i, resp.StatusCode, out)
			}
			var r struct {
				Choices []struct {
					FinishReason   string  `json:"finish_reason"`
					WeightVersions []int64 `json:"weight_versions"`
				} `json:"choices"`
				Outputs []struct {
					FinishReason   string  `json:"finish_reason"`
					WeightVersions []int64 `json:"weight_versions"`
				} `json:"outputs"`
			}
			if err := json.Unmarshal(out, &r); err != nil {
				return fmt.Errorf("request %d: %w: %s", i, err, out)
			}
			seqs := append(r.Choices, r.Outputs...)
			if len(seqs) == 0 {
				return fmt.Errorf("request %d: no choices: %s", i, out)
			}
			for _, c := range seqs {
				if !okFinish(c.FinishReason) {
					return fmt.Errorf("request %d: finish reason %q", i, c.FinishReason)
				}
				for k := 1; k < len(c.WeightVersions); k++ {
					if c.WeightVersions[k] < c.WeightVersions[k-1] {
						return fmt.Errorf("request %d: weight versions go back: %v", i, c.WeightVersions)
					}
				}
				count("finish:" + c.FinishReason)
			}
		case 1: // streaming, n=2, chat every other time
			path := "/v1/completions"
			body := fmt.Sprintf(`{"prompt":%s,"max_tokens":%d,"n":2,"stream":true}`, pj, maxTok)
			if i%2 == 0 {
				path = "/v1/chat/completions"
				body = fmt.Sprintf(`{"messages":[{"role":"user","content":"q%d"}],"max_tokens":%d,"n":2,"stream":true}`, i, maxTok)
			}
			resp, err := post(rctx, path, body)
			if err != nil {
				return fmt.Errorf("request %d: %w", i, err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				return fmt.Errorf("request %d: status %d: %s", i, resp.StatusCode, b)
			}
			evs, done := sseEvents(t, resp.Body)
			if !done {
				return fmt.Errorf("request %d: stream ended without [DONE] after %d events", i, len(evs))
			}
			finishes := 0
			for _, e := range evs {
				if strings.Contains(e, `"error"`) {
					return fmt.Errorf("request %d: stream error %s", i, e)
				}
				if !strings.Contains(e, `"finish_reason":null`) && strings.Contains(e, `"finish_reason":"`) {
					finishes++
				}
			}
			if finishes != 2 {
				return fmt.Errorf("request %d: %d finished choices, want 2", i, finishes)
			}
			count("stream")
		case 3: // the client disconnects mid-stream
			dctx, dcancel := context.WithCancel(rctx)
			defer dcancel()
			resp, err := post(dctx, "/v1/completions", fmt.Sprintf(`{"prompt":%s,"max_tokens":%d,"ignore_eos":true,"stream":true}`, pj, 200/loadTokens+maxTok))
			if err != nil {
				return fmt.Errorf("request %d: %w", i, err)
			}
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				return fmt.Errorf("request %d: status %d: %s", i, resp.StatusCode, b)
			}
			// Wait for the first event (or the end, if a pause aborted it), then hang up.
			_, _ = bufio.NewReader(resp.Body).ReadString('\n')
			dcancel()
			resp.Body.Close()
			count("disconnect")
		case 4: // aborted through the admin plane
			id := fmt.Sprintf("load-abort-%d", i)
			res := make(chan error, 1)
			go func() {
				resp, err := post(rctx, "/generate", fmt.Sprintf(`{"prompt_token_ids":%s,"request_id":%q,"sampling":{"max_tokens":%d,"ignore_eos":true}}`, pj, id, 300/loadTokens+maxTok))
				if err != nil {
					res <- err
					return
				}
				out, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var r genResp
				switch {
				case resp.StatusCode == http.StatusConflict && bytes.Contains(out, []byte("duplicate")):
					res <- fmt.Errorf("duplicate id %s", id)
				case resp.StatusCode != http.StatusOK:
					res <- fmt.Errorf("status %d: %s", resp.StatusCode, out)
				case json.Unmarshal(out, &r) != nil || len(r.Outputs) != 1 || !okFinish(r.Outputs[0].FinishReason):
					res <- fmt.Errorf("bad response %s", out)
				default:
					count("abortable:" + r.Outputs[0].FinishReason)
					res <- nil
				}
			}()
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
			if resp, err := post(rctx, "/abort_requests", fmt.Sprintf(`{"request_ids":[%q]}`, id)); err == nil {
				resp.Body.Close()
			}
			if err := <-res; err != nil {
				return fmt.Errorf("request %d: %w", i, err)
			}
		}
		return nil
	}

	errs := make(chan error, total)
	for i := range total {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := one(i); err != nil {
				errs <- err
			}
			finished.Add(1)
		}()
	}

	// The admin plane churns until every request is done.
	adminDone := make(chan struct{})
	var adminErr error
	go func() {
		defer close(adminDone)
		version := int64(1)
		modes := []string{"abort", "wait", "keep"}
		for round := 0; finished.Load() < total && ctx.Err() == nil; round++ {
			call := func(method, path string, body any) error {
				code, out, err := ts.tryDo(method, path, body)
				if err != nil {
					return err
				}
				if code != http.StatusOK {
					return fmt.Errorf("%s %s: %d %s", method, path, code, out)
				}
				return nil
			}
			steps := []func() error{
				func() error { return call("POST", "/pause?clear_cache=true&mode="+modes[round%3], nil) },
				func() error {
					if round%2 == 0 {
						return call("POST", "/sleep?level=1", nil)
					}
					return nil
				},
				func() error {
					version++
					c := ckpts[round%len(ckpts)]
					return call("POST", "/update_weights", map[string]any{"version": version, "source": c[0], "sha256": c[1]})
				},
				func() error { return call("POST", "/wake_up", nil) },
				func() error { return call("POST", "/resume", nil) },
			}
			for _, s := range steps {
				if err := s(); err != nil {
					adminErr = err
					return
				}
			}
			time.Sleep(30 * time.Millisecond)
		}
	}()

	wg.Wait()
	<-adminDone
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.NoError(t, adminErr)
	require.NoError(t, ctx.Err(), "the load did not finish in time")
	st := ts.waitState(t, "everything drained", func(s stateResp) bool {
		return s.State == "running" && s.RequestsRunning == 0 && s.RequestsWaiting == 0 && s.HTTPInflight == 0
	})
	assert.Zero(t, st.KVBlocksUsed, "no block leak")
	assert.Greater(t, st.WeightVersion, int64(1), "weights were swapped under load")
	kinds.Range(func(k, v any) bool {
		t.Logf("%s: %d", k, v.(*atomic.Int64).Load())
		return true
	})
}
