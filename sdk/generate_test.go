package sdk

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeGen is a hand-written /generate for routing and continuation unit tests: it answers
// with token ids counting up from the prompt's length, each stamped with version, and can be
// told to abort or fail requests.
type fakeGen struct {
	t       *testing.T
	srv     *httptest.Server
	version int64

	mu       sync.Mutex
	requests []wireRequest
	abortAt  int // abort a request after this many tokens (0: never); once
	status   int // answer with this status instead (0: 200)
	hook     func()
}

func newFakeGen(t *testing.T, version int64) *fakeGen {
	g := &fakeGen{t: t, version: version}
	g.srv = httptest.NewServer(http.HandlerFunc(g.serve))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *fakeGen) serve(w http.ResponseWriter, r *http.Request) {
	var req wireRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || r.URL.Path != "/generate" {
		http.Error(w, `{"error":{"message":"bad request","type":"invalid_request_error","code":"bad"}}`, http.StatusBadRequest)
		return
	}
	g.mu.Lock()
	g.requests = append(g.requests, req)
	hook := g.hook
	g.mu.Unlock()
	if hook != nil {
		hook()
	}
	g.mu.Lock()
	status, abortAt := g.status, g.abortAt
	if abortAt > 0 {
		g.abortAt = 0
	}
	g.mu.Unlock()
	if status != 0 {
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"error":{"message":"injected","type":"server_error","code":"injected"}}`))
		return
	}
	resp := wireResponse{RequestID: req.RequestID, WeightVersion: g.version}
	for range req.N {
		o := wireOutput{FinishReason: FinishLength}
		n := req.Sampling.MaxTokens
		switch {
		case abortAt < 0:
			n, o.FinishReason = 0, FinishAbort
		case abortAt > 0 && abortAt < n:
			n, o.FinishReason = abortAt, FinishAbort
		}
		for j := range n {
			o.TokenIDs = append(o.TokenIDs, len(req.PromptTokenIDs)+j)
			o.Logprobs = append(o.Logprobs, -0.5)
			o.WeightVersions = append(o.WeightVersions, g.version)
		}
		resp.Outputs = append(resp.Outputs, o)
	}
	_ = json.NewEncoder(w).Encode(resp)
}

func (g *fakeGen) got() []wireRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]wireRequest(nil), g.requests...)
}

func genFleet(t *testing.T, n int, version int64) ([]*fakeAgent, []*fakeGen, *Client) {
	_, agents, c := newMemFleet(t, secret, n, version)
	var gens []*fakeGen
	for _, a := range agents {
		g := newFakeGen(t, version)
		a.set(func(a *fakeAgent) { a.url = g.srv.URL })
		gens = append(gens, g)
	}
	_, err := c.Status(t.Context()) // refresh the routing cache with the new URLs
	require.NoError(t, err)
	return agents, gens, c
}

func TestGenerateGroupGoesToOneServer(t *testing.T) {
	_, gens, c := genFleet(t, 3, 2)
	prompt := []int{5, 6, 7}
	res, err := c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: prompt, N: 4, Sampling: SamplingParams{MaxTokens: 5}, RequestID: "g1"})
	require.NoError(t, err)
	require.Len(t, res.Samples, 4)
	require.Len(t, res.Servers, 1)
	for _, s := range res.Samples {
		assert.Equal(t, []int{3, 4, 5, 6, 7}, s.TokenIDs())
		assert.Equal(t, []int64{2, 2, 2, 2, 2}, s.WeightVersions())
		assert.Equal(t, -0.5, s.Logprobs()[0])
		assert.Equal(t, FinishLength, s.FinishReason)
	}
	total := 0
	for _, g := range gens {
		for _, r := range g.got() {
			total++
			assert.Equal(t, 4, r.N, "the group is one request")
			assert.Equal(t, "g1", r.RequestID)
		}
	}
	assert.Equal(t, 1, total)

	// The same prompt goes to the same server again (affinity) while the fleet is idle.
	for range 5 {
		res2, err := c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: prompt, N: 4, Sampling: SamplingParams{MaxTokens: 5}})
		require.NoError(t, err)
		assert.Equal(t, res.Servers, res2.Servers)
	}
}

func TestGenerateRetriesOnAnotherServer(t *testing.T) {
	agents, gens, c := genFleet(t, 2, 0)
	prompt := []int{1, 2, 3}
	home := agents[choose([]candidate{{id: "a"}, {id: "b"}}, affinityKey(prompt, ""), "", 1)].id
	other := map[string]int{"a": 1, "b": 0}[home]
	gens[1-other].mu.Lock()
	gens[1-other].status = http.StatusServiceUnavailable
	gens[1-other].mu.Unlock()
	res, err := c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: prompt, Sampling: SamplingParams{MaxTokens: 3}})
	require.NoError(t, err)
	assert.Equal(t, []string{agents[other].id}, res.Servers)
	assert.Equal(t, 1, res.Retries)
	require.Len(t, res.Failures, 1)
	assert.Equal(t, agents[1-other].id, res.Failures[0].ServerID)
	assert.Contains(t, res.Failures[0].Error, "503")

	// A dead server (connection refused) too.
	gens[1-other].srv.Close()
	res, err = c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: prompt, Sampling: SamplingParams{MaxTokens: 3}})
	require.NoError(t, err)
	assert.Equal(t, []string{agents[other].id}, res.Servers)
}

func TestGenerateContinuesAbortedSample(t *testing.T) {
	_, gens, c := genFleet(t, 1, 7)
	gens[0].mu.Lock()
	gens[0].abortAt = 2
	gens[0].mu.Unlock()
	res, err := c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{9, 9}, N: 2, Sampling: SamplingParams{MaxTokens: 6}, RequestID: "r"})
	require.NoError(t, err)
	reqs := gens[0].got()
	require.Len(t, reqs, 3, "the group, then one continuation per aborted sample")
	for _, s := range res.Samples {
		assert.Equal(t, FinishLength, s.FinishReason)
		assert.Equal(t, 1, s.Continuations)
		// Two tokens from the first request, then four continuing after prompt+2 tokens.
		assert.Equal(t, []int{2, 3, 4, 5, 6, 7}, s.TokenIDs())
	}
	assert.Equal(t, 2, res.Continuations)
	for _, r := range reqs[1:] {
		assert.Equal(t, 1, r.N)
		assert.Equal(t, []int{9, 9, 2, 3}, r.PromptTokenIDs)
		assert.Equal(t, 4, r.Sampling.MaxTokens)
	}
}

func TestGenerateDoesNotContinueCallerAbort(t *testing.T) {
	_, gens, c := genFleet(t, 1, 0)
	// The caller's abort-all lands while the request is in flight: the server records it
	// before answering.
	gens[0].mu.Lock()
	gens[0].abortAt = 1
	gens[0].hook = func() { c.aborts.record(nil) }
	gens[0].mu.Unlock()
	res, err := c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{1}, Sampling: SamplingParams{MaxTokens: 4}})
	require.NoError(t, err)
	assert.Equal(t, FinishAbort, res.Samples[0].FinishReason)
	assert.Equal(t, 0, res.Continuations)
	assert.Len(t, gens[0].got(), 1)
}

func TestGenerateErrors(t *testing.T) {
	agents, gens, c := genFleet(t, 2, 3)
	_, err := c.Generate(t.Context(), GenerateRequest{})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{1}, Sampling: SamplingParams{TopP: 2}})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{1}, MinVersion: 9})
	require.ErrorIs(t, err, ErrStale)
	for _, g := range gens {
		g.mu.Lock()
		g.status = http.StatusUnprocessableEntity
		g.mu.Unlock()
	}
	_, err = c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{1}})
	require.ErrorIs(t, err, ErrRejected)
	assert.Contains(t, err.Error(), "injected")
	for _, a := range agents {
		a.stop()
		require.NoError(t, a.b.Delete(t.Context(), c.names.Heartbeat(a.id)))
	}
	_, err = c.Status(t.Context())
	require.NoError(t, err)
	_, err = c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{1}})
	require.ErrorIs(t, err, ErrNoServers)
}

func TestChooseBoundedLoad(t *testing.T) {
	cands := []candidate{{id: "a"}, {id: "b"}, {id: "c"}}
	key := affinityKey([]int{1, 2, 3}, "")
	home := choose(cands, key, "", 1)
	require.GreaterOrEqual(t, home, 0)
	assert.Equal(t, home, choose(cands, key, "", 1), "deterministic")
	// The home server runs far ahead: the request spills to the next-ranked one.
	cands[home].load = 100
	spill := choose(cands, key, "", 1)
	assert.NotEqual(t, home, spill)
	// Within the slack it stays home.
	cands[home].load = 5
	assert.Equal(t, home, choose(cands, key, "", 1))
	assert.Equal(t, -1, choose(nil, key, "", 1))

	// A pin wins over the home while it is a candidate within the load bound, and falls back
	// to the bounded-load choice when it runs ahead or is gone (a dead server).
	cands[home].load = 0
	other := (home + 1) % len(cands)
	assert.Equal(t, other, choose(cands, key, cands[other].id, 1))
	cands[other].load = 100
	assert.Equal(t, home, choose(cands, key, cands[other].id, 1))
	assert.Equal(t, home, choose(cands, key, "gone", 1))
	cands[other].load = 0

	// Keys spread over the servers.
	counts := map[string]int{}
	for i := range 300 {
		counts[cands[choose([]candidate{{id: "a"}, {id: "b"}, {id: "c"}}, affinityKey([]int{i, i + 1}, ""), "", 1)].id]++
	}
	for _, id := range []string{"a", "b", "c"} {
		assert.Greater(t, counts[id], 50, id)
	}
	// The salt is part of the key.
	assert.NotEqual(t, affinityKey([]int{1}, ""), affinityKey([]int{1}, "v2"))
	// Only the first block counts.
	long := make([]int, 40)
	long2 := make([]int, 40)
	long2[39] = 1
	assert.Equal(t, affinityKey(long, ""), affinityKey(long2, ""))
}

func TestGenerateGivesUpOnAServerThatAlwaysAborts(t *testing.T) {
	_, gens, c := genFleet(t, 1, 0)
	gens[0].mu.Lock()
	gens[0].hook = func() {
		gens[0].mu.Lock()
		gens[0].abortAt = -1 // every request: abort with no token
		gens[0].mu.Unlock()
	}
	gens[0].mu.Unlock()
	_, err := c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{1}, Sampling: SamplingParams{MaxTokens: 4}})
	require.ErrorIs(t, err, ErrFailed)
	assert.Contains(t, err.Error(), "without a new token")
}

func TestGenerateRoutesToACommittingServer(t *testing.T) {
	agents, gens, c := genFleet(t, 1, 0)
	agents[0].set(func(a *fakeAgent) { a.paused = true })
	_, err := c.Status(t.Context())
	require.NoError(t, err)
	c.opts.RouteTimeout = 100 * time.Millisecond
	_, err = c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{1}})
	require.ErrorIs(t, err, ErrTimeout, "a paused server takes nothing")

	// While this client commits to it, it does (its engine queues until the resume).
	c.committing([]string{"a"}, 1)
	res, err := c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{1}, MinVersion: 1})
	require.NoError(t, err, "the committing server is routable at the version it commits")
	assert.Equal(t, []string{"a"}, res.Servers)
	assert.Len(t, gens[0].got(), 1)
	c.committing([]string{"a"}, 0)
	_, err = c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{1}})
	require.ErrorIs(t, err, ErrTimeout)
}
