package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/sample"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// handleGenerate serves the native POST /generate, whose wire types sdk/protocol defines for
// both sides.
func (a *API) handleGenerate(c *gin.Context) {
	req := protocol.GenerateRequest[sample.Params]{N: 1, Sampling: sample.Defaults()}
	if err := readJSON(c, &req); err != nil {
		writeError(c, err)
		return
	}
	if req.MinVersion < 0 {
		writeError(c, badRequest("invalid_value", "min_version", "min_version must be >= 0 (got %d)", req.MinVersion))
		return
	}
	if req.MinVersion > 0 {
		if v := a.awaitVersion(c.Request.Context(), req.MinVersion); v < req.MinVersion {
			writeError(c, &Error{Status: http.StatusConflict, Type: typeConflict, Code: "stale_version", Param: "min_version",
				Message: fmt.Sprintf("serving weight version %d is older than min_version %d", v, req.MinVersion)})
			return
		}
	}
	id := req.RequestID
	if id == "" {
		id = a.newID("gen")
	}
	spec := genSpec{clientID: id, prompts: [][]int{req.PromptTokenIDs}, n: req.N, params: req.Sampling, cacheSalt: req.CacheSalt}
	if req.PromptTokenIDs == nil {
		writeError(c, badRequest("missing_field", "prompt_token_ids", "prompt_token_ids is required"))
		return
	}
	ctx := c.Request.Context()
	run, ok := a.start(c, spec)
	if !ok {
		return
	}
	defer run.end()
	if err := run.collect(ctx); err != nil {
		writeError(c, err)
		return
	}
	resp := protocol.GenerateResponse{RequestID: id, WeightVersion: a.responseVersion(run.choices), Outputs: make([]protocol.GenerateOutput, len(run.choices))}
	for i, ch := range run.choices {
		o := protocol.GenerateOutput{TokenIDs: idsOf(ch.tokens), Logprobs: logprobsOf(ch.tokens), WeightVersions: versionsOf(ch.tokens),
			FinishReason: protocol.FinishReason(ch.finish), NumCachedTokens: ch.cached}
		if spec.params.Logprobs > 0 {
			o.TopLogprobs = make([][]protocol.TopLogprob, len(ch.tokens))
			for j, t := range ch.tokens {
				top := make([]protocol.TopLogprob, len(t.Top))
				for k, tl := range t.Top {
					top[k] = protocol.TopLogprob{Token: tl.Token, Logprob: protocol.Logprob(tl.Logprob)}
				}
				o.TopLogprobs[j] = top
			}
		}
		resp.Outputs[i] = o
	}
	c.PureJSON(http.StatusOK, resp)
}

type tokenizeRequest struct {
	Model            string        `json:"model"`
	Prompt           *string       `json:"prompt"`
	Messages         []chatMessage `json:"messages"`
	AddSpecialTokens *bool         `json:"add_special_tokens"`
	// Tools are rendered into a messages prompt as /v1/chat/completions renders them.
	Tools json.RawMessage `json:"tools"`
}

func (a *API) handleTokenize(c *gin.Context) {
	var req tokenizeRequest
	if err := readJSON(c, &req); err != nil {
		writeError(c, err)
		return
	}
	if err := a.checkModel(req.Model); err != nil {
		writeError(c, err)
		return
	}
	var text string
	var content [][2]int
	fromChat := false
	switch {
	case req.Prompt != nil && req.Messages != nil:
		writeError(c, badRequest("invalid_value", "prompt", "give prompt or messages, not both"))
		return
	case req.Prompt != nil:
		text = *req.Prompt
	case req.Messages != nil:
		t, cs, _, _, err := a.renderChat(req.Messages, req.Tools, nil)
		if err != nil {
			writeError(c, err)
			return
		}
		text, content, fromChat = t, cs, true
	default:
		writeError(c, badRequest("missing_field", "prompt", "prompt or messages is required"))
		return
	}
	addSpecial := req.AddSpecialTokens == nil || *req.AddSpecialTokens
	var ids []int
	var err error
	if fromChat {
		ids, err = a.encodeChat(text, content, addSpecial)
	} else {
		ids, err = a.encodeText(text, addSpecial)
	}
	if err != nil {
		writeError(c, err)
		return
	}
	c.PureJSON(http.StatusOK, gin.H{"tokens": ids, "count": len(ids), "max_model_len": a.cfg.ModelConfig.MaxPositionEmbeddings})
}

type detokenizeRequest struct {
	Model  string `json:"model"`
	Tokens []int  `json:"tokens"`
}

func (a *API) handleDetokenize(c *gin.Context) {
	var req detokenizeRequest
	if err := readJSON(c, &req); err != nil {
		writeError(c, err)
		return
	}
	if err := a.checkModel(req.Model); err != nil {
		writeError(c, err)
		return
	}
	if req.Tokens == nil {
		writeError(c, badRequest("missing_field", "tokens", "tokens is required"))
		return
	}
	for i, id := range req.Tokens {
		if id < 0 || id >= a.cfg.ModelConfig.VocabSize {
			writeError(c, badRequest("invalid_token_id", "tokens", "tokens[%d] = %d is outside the vocabulary [0, %d)", i, id, a.cfg.ModelConfig.VocabSize))
			return
		}
	}
	c.PureJSON(http.StatusOK, gin.H{"prompt": a.decodeLossy(req.Tokens)})
}

func (a *API) handleModels(c *gin.Context) {
	c.PureJSON(http.StatusOK, gin.H{"object": "list", "data": []gin.H{{
		"id": a.cfg.ModelName, "object": "model", "created": a.created, "owned_by": "rollout",
		"max_model_len": a.cfg.ModelConfig.MaxPositionEmbeddings, "weight_version": a.eng.Version(),
	}}})
}

func (a *API) handleHealth(c *gin.Context) {
	if !a.eng.Metrics().Alive {
		writeError(c, &Error{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "engine_dead", Message: "the engine loop is not running"})
		return
	}
	c.PureJSON(http.StatusOK, gin.H{"status": "ok"})
}

// notReady says why the server cannot serve, or "" when it can.
func (a *API) notReady() string {
	m := a.eng.Metrics()
	switch {
	case !m.Alive:
		return "engine loop not running"
	case a.closing.Load():
		return "shutting down"
	case a.updating.Load():
		return "updating weights"
	case m.State != engine.StateRunning:
		return "engine is " + string(m.State)
	}
	if a.cfg.Ready != nil {
		if err := a.cfg.Ready(); err != nil {
			return err.Error()
		}
	}
	return ""
}

func (a *API) handleReady(c *gin.Context) {
	if why := a.notReady(); why != "" {
		writeError(c, &Error{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "not_ready", Message: why})
		return
	}
	c.PureJSON(http.StatusOK, gin.H{"status": "ready", "weight_version": a.eng.Version()})
}

func (a *API) handleVersion(c *gin.Context) {
	c.PureJSON(http.StatusOK, gin.H{"version": a.cfg.Version, "model": a.cfg.ModelName, "weight_version": a.eng.Version(),
		"time": time.Now().UTC().Format(time.RFC3339)})
}

// floorWait bounds how long a request whose floor is the version being committed waits
// for the swap; a cut takes well under a second, and one that takes longer is failing.
const floorWait = 30 * time.Second

// awaitVersion returns the serving version once it is at least floor. Versions only grow,
// so a request admitted then never runs on older weights. When the server is below floor
// but has floor staged (a commit is cutting over to it: the fleet routes requests to a
// server it is committing to, and they wait out the cut there) it waits for the swap, up to
// floorWait or until the staged set changes; otherwise it answers at once.
func (a *API) awaitVersion(ctx context.Context, floor int64) int64 {
	// settled reads the staged version before the serving one a second time: a commit
	// stores the new serving version first, so "nothing staged" is never read together
	// with the old serving version.
	settled := func() (int64, bool) {
		if v := a.eng.Version(); v >= floor {
			return v, true
		}
		if a.eng.StagedVersion() < floor {
			return a.eng.Version(), true
		}
		return 0, false
	}
	if v, ok := settled(); ok {
		return v
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(floorWait)
	defer deadline.Stop()
	for {
		select {
		case <-ctx.Done():
			return a.eng.Version()
		case <-deadline.C:
			return a.eng.Version()
		case <-tick.C:
			if v, ok := settled(); ok {
				return v
			}
		}
	}
}
