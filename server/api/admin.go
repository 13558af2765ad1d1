package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// queryBool parses an optional boolean query parameter.
func queryBool(c *gin.Context, name string, def bool) (bool, error) {
	v, ok := c.GetQuery(name)
	if !ok || v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, badRequest("invalid_value", name, "query parameter %s=%q: want true or false", name, v)
	}
	return b, nil
}

func queryMode(c *gin.Context) (engine.PauseMode, error) {
	v := c.DefaultQuery("mode", string(engine.PauseAbort))
	m, err := engine.ParsePauseMode(v)
	if err != nil {
		return "", badRequest("invalid_value", "mode", "query parameter mode=%q: want abort, wait or keep", v)
	}
	return m, nil
}

func (a *API) handlePause(c *gin.Context) {
	mode, err := queryMode(c)
	if err != nil {
		writeError(c, err)
		return
	}
	clearCache, err := queryBool(c, "clear_cache", true)
	if err != nil {
		writeError(c, err)
		return
	}
	r, err := a.eng.Pause(c.Request.Context(), mode, clearCache)
	if err != nil {
		writeError(c, err)
		return
	}
	body := gin.H{"status": protocol.StatePaused, "mode": string(mode), "clear_cache": clearCache}
	if clearCache {
		body["reset"] = r
	}
	c.PureJSON(http.StatusOK, body)
}

func (a *API) handleResume(c *gin.Context) {
	if err := a.eng.Resume(c.Request.Context()); err != nil {
		writeError(c, err)
		return
	}
	c.PureJSON(http.StatusOK, gin.H{"status": "resumed"})
}

func (a *API) handleIsPaused(c *gin.Context) {
	p, err := a.eng.IsPaused(c.Request.Context())
	if err != nil {
		writeError(c, err)
		return
	}
	c.PureJSON(http.StatusOK, gin.H{"is_paused": p})
}

func (a *API) handleSleep(c *gin.Context) {
	lv := c.DefaultQuery("level", "1")
	level, err := strconv.Atoi(lv)
	if err != nil || level < 0 || level > 2 {
		writeError(c, badRequest("invalid_value", "level", "query parameter level=%q: want 0, 1 or 2", lv))
		return
	}
	mode, err := queryMode(c)
	if err != nil {
		writeError(c, err)
		return
	}
	if err := a.eng.Sleep(c.Request.Context(), level, mode); err != nil {
		writeError(c, err)
		return
	}
	a.ReleaseWeightSets(level)
	c.PureJSON(http.StatusOK, gin.H{"status": protocol.StateSleeping, "level": level})
}

func (a *API) handleWakeUp(c *gin.Context) {
	tags := c.QueryArray("tags")
	for _, t := range tags {
		if t != engine.TagWeights && t != engine.TagKVCache {
			writeError(c, badRequest("invalid_value", "tags", "query parameter tags=%q: want weights or kv_cache", t))
			return
		}
	}
	if err := a.eng.WakeUp(c.Request.Context(), tags); err != nil {
		writeError(c, err)
		return
	}
	c.PureJSON(http.StatusOK, gin.H{"status": "awake", "tags": tags})
}

func (a *API) handleIsSleeping(c *gin.Context) {
	s, err := a.eng.IsSleeping(c.Request.Context())
	if err != nil {
		writeError(c, err)
		return
	}
	c.PureJSON(http.StatusOK, gin.H{"is_sleeping": s})
}

func (a *API) handleResetPrefixCache(c *gin.Context) {
	running, err := queryBool(c, "reset_running_requests", false)
	if err != nil {
		writeError(c, err)
		return
	}
	external, err := queryBool(c, "reset_external", false)
	if err != nil {
		writeError(c, err)
		return
	}
	r, err := a.eng.ResetPrefixCache(c.Request.Context(), running, external)
	if err != nil {
		writeError(c, err)
		return
	}
	c.PureJSON(http.StatusOK, r)
}

// updateWeightsRequest is POST /update_weights. An empty source commits the weights staged
// earlier (with stage_only) as version.
type updateWeightsRequest struct {
	Version   int64  `json:"version"`
	Source    string `json:"source"`
	SHA256    string `json:"sha256"`
	StageOnly bool   `json:"stage_only"`
}

type updateWeightsResponse struct {
	WeightVersion int64   `json:"weight_version"`
	Staged        bool    `json:"staged"`
	StagedVersion int64   `json:"staged_version,omitempty"`
	Bytes         int64   `json:"bytes"`
	Seconds       float64 `json:"seconds"`
	Digest        string  `json:"sha256,omitempty"`
}

func (a *API) handleUpdateWeights(c *gin.Context) {
	var req updateWeightsRequest
	if err := readJSON(c, &req); err != nil {
		writeError(c, err)
		return
	}
	if err := a.checkVersion(req.Version); err != nil {
		writeError(c, err)
		return
	}
	if err := a.updateMu.lock(c.Request.Context()); err != nil {
		writeError(c, err)
		return
	}
	defer a.updateMu.unlock()
	resp, err := a.updateWeights(c.Request.Context(), req)
	if err != nil {
		a.log.Warn("api: weight update failed; the old weights keep serving", "version", req.Version, "source", weights.RedactURI(req.Source), "err", err)
		writeError(c, err)
		return
	}
	c.PureJSON(http.StatusOK, resp)
}

// Bounds of an admin weight version: a version that jumps further than MaxVersionStep past
// the serving one (or beyond MaxVersion, the largest integer JSON carries exactly) would
// make the trainer's next updates stale. A trainer numbers its updates 1, 2, 3...; the
// step leaves room for skipped ones.
const (
	MaxVersion     = 1<<53 - 1
	MaxVersionStep = 1024
)

// checkVersion refuses a version that is not positive, not newer than the serving one, or too
// far ahead of it.
func (a *API) checkVersion(v int64) error {
	cur := a.eng.Version()
	switch {
	case v <= 0:
		return badRequest("invalid_value", "version", "version must be > 0 (got %d)", v)
	case v <= cur:
		return &Error{Status: http.StatusConflict, Type: typeConflict, Code: "stale_version", Param: "version",
			Message: fmt.Sprintf("version %d is not newer than the serving version %d", v, cur)}
	case v > MaxVersion || v-cur > MaxVersionStep:
		return badRequest("invalid_value", "version", "version %d is too far ahead of the serving version %d (at most %d newer, at most %d)",
			v, cur, int64(MaxVersionStep), int64(MaxVersion))
	}
	return nil
}

func (a *API) updateWeights(ctx context.Context, req updateWeightsRequest) (updateWeightsResponse, error) {
	start := time.Now()
	var resp updateWeightsResponse
	if req.Source == "" {
		if req.StageOnly {
			return resp, badRequest("missing_field", "source", "stage_only needs a source")
		}
		st, err := a.eng.Stats(ctx)
		if err != nil {
			return resp, err
		}
		if st.StagedVersion != req.Version {
			return resp, &Error{Status: http.StatusConflict, Type: typeConflict, Code: "nothing_staged", Param: "version",
				Message: fmt.Sprintf("no source given and version %d is not staged (staged: %d)", req.Version, st.StagedVersion)}
		}
	} else {
		info, err := a.fetchAndStage(ctx, weights.Ref{Version: req.Version, URI: req.Source, SHA256: req.SHA256}, nil)
		if err != nil {
			return resp, err
		}
		resp.Bytes, resp.Digest = info.Bytes, info.Digest
	}
	if req.StageOnly {
		resp.WeightVersion, resp.Staged, resp.StagedVersion = a.eng.Version(), true, req.Version
	} else {
		t := time.Now()
		// Only the commit swaps weights: until then the old ones serve and /ready says so.
		a.updating.Store(true)
		// The commit names the version: if another caller staged over it meanwhile, this
		// fails (ErrNotStaged) instead of committing someone else's weights.
		v, err := a.eng.CommitWeights(ctx, req.Version)
		a.updating.Store(false)
		if err != nil {
			return resp, err
		}
		a.metrics.ObserveUpdate(ctx, "commit", time.Since(t))
		resp.WeightVersion = v
	}
	resp.Seconds = time.Since(start).Seconds()
	a.metrics.ObserveUpdate(ctx, "total", time.Since(start))
	return resp, nil
}

// fetchAndStage fetches and verifies ref and stages it in the engine while the old weights
// keep serving; /update_weights and the fleet agent's stage command share it.
func (a *API) fetchAndStage(ctx context.Context, ref weights.Ref, tweak func(*weights.Options)) (weights.Info, error) {
	start := time.Now()
	if ref.SHA256 == "" && weights.IsHTTP(ref.URI) && !a.cfg.AllowUnverifiedWeights {
		return weights.Info{}, badRequest("digest_required", "sha256",
			"an http(s) weight source needs a sha256 (the server was not started with --allow-unverified-weights)")
	}
	if a.cfg.NoFileWeights && !weights.IsHTTP(ref.URI) {
		return weights.Info{}, &Error{Status: http.StatusUnprocessableEntity, Type: typeInvalidRequest, Code: "source_refused", Param: "source",
			Message: "file weight sources are off on this server (start it with --weights-root DIR to allow those under DIR)"}
	}
	// One deadline for the whole fetch and load, whatever the source: with the client's
	// minimum rate it bounds how long a source can hold the update lock.
	dctx, cancel := context.WithTimeoutCause(ctx, a.fetchTimeout(), errFetchDeadline)
	defer cancel()
	fctx, span := a.cfg.TracerProvider.Tracer(tracerName).Start(dctx, "weights.fetch", trace.WithAttributes(
		attribute.Int64("rollout.weight_version", ref.Version), attribute.String("rollout.weights_uri", weights.RedactURI(ref.URI))))
	opts := weights.Options{Root: a.cfg.WeightsRoot, HTTPClient: a.cfg.WeightsHTTPClient, MaxDownloadBytes: weights.DownloadLimit(a.cfg.ModelConfig)}
	if tweak != nil {
		tweak(&opts)
	}
	// Into a set the engine no longer reads (the rule is at API.sets); a failed load leaves it
	// undefined, and it is dropped with opts. Below F32, into the engine's packed model one
	// tensor at a time instead, so that no float32 set of the update exists.
	var b *model.Builder
	if a.recycles() {
		opts.Reuse = a.sets.Take(a.eng.VersionsInUse()...)
	} else {
		var err error
		if b, err = a.eng.Builder(); err != nil {
			span.End()
			return weights.Info{}, err
		}
		opts.Sink = b
	}
	w, info, err := weights.LoadWithInfo(fctx, ref, opts)
	span.SetAttributes(attribute.Int64("rollout.bytes", info.Bytes))
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(dctx), errFetchDeadline) {
		err = &Error{Status: http.StatusGatewayTimeout, Type: typeUnavailable, Code: "fetch_timeout", Param: "source",
			Message: fmt.Sprintf("the weights were not fetched and loaded within %v", a.fetchTimeout())}
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.End()
		return info, err
	}
	span.End()
	a.metrics.ObserveUpdate(ctx, "fetch", time.Since(start))
	t := time.Now()
	if b != nil {
		err = a.eng.StageBuilt(ctx, b, ref.Version)
	} else {
		err = a.eng.StageWeights(ctx, w, ref.Version)
	}
	if a.recycles() {
		a.sets.Keep(w, ref.Version) // staged or not: the version decides when it is free
	}
	if err != nil {
		if errors.Is(err, engine.ErrInvalidArgument) {
			return info, &Error{Status: http.StatusUnprocessableEntity, Type: typeInvalidRequest, Code: "shape_mismatch", Param: "source", Message: err.Error()}
		}
		return info, err
	}
	a.metrics.ObserveUpdate(ctx, "stage", time.Since(t))
	return info, nil
}

// errFetchDeadline is the cause of a fetch that ran out of its overall deadline.
var errFetchDeadline = errors.New("api: weight fetch deadline")

// fetchTimeout is the overall deadline of one weight fetch and load.
func (a *API) fetchTimeout() time.Duration {
	if d := a.cfg.WeightsFetch.FetchTimeout; d > 0 {
		return d
	}
	return weights.DefaultFetchTimeout
}

// StageWeights fetches, verifies and stages ref (the path of POST /update_weights with
// stage_only) and returns the bytes read. It is serialised with /update_weights. Errors
// carry the codes ErrorCode reports.
func (a *API) StageWeights(ctx context.Context, ref weights.Ref) (int64, error) {
	return a.StageWeightsWith(ctx, ref, nil)
}

// StageWeightsWith is StageWeights with the fetch's options adjusted by tweak (the fleet's
// peer sources, a download kept for peers, a progress observer).
func (a *API) StageWeightsWith(ctx context.Context, ref weights.Ref, tweak func(*weights.Options)) (int64, error) {
	if ref.Version <= 0 {
		return 0, badRequest("invalid_value", "version", "version must be > 0 (got %d)", ref.Version)
	}
	if err := a.updateMu.lock(ctx); err != nil {
		return 0, err
	}
	defer a.updateMu.unlock()
	start := time.Now()
	info, err := a.fetchAndStage(ctx, ref, tweak)
	if err != nil {
		a.log.Warn("api: staging weights failed; the old weights keep serving", "version", ref.Version, "source", weights.RedactURI(ref.URI), "err", err)
		return info.Bytes, err
	}
	a.metrics.ObserveUpdate(ctx, "total", time.Since(start))
	return info.Bytes, nil
}

// ReleaseWeightSets gives back the memory of the weight sets kept for reuse that an engine
// sleep at level frees. Level 1 frees the KV cache only: like vLLM's level 1, which keeps the
// weights in host memory, it keeps every set, so the update of the RL cycle (pause, sleep 1,
// update, wake, resume) still loads and packs into touched memory instead of faulting a
// model's worth of new pages every training step. Level 2 gives back every set but a staged
// one (the engine dropped its own). The server calls it after every successful Sleep, the
// fleet agent's included.
func (a *API) ReleaseWeightSets(level int) {
	if level != 2 {
		return
	}
	if v := a.eng.StagedVersion(); v > 0 { // staged versions are above the serving one, so never 0
		a.sets.Release(v)
	} else {
		a.sets.Release()
	}
}

// ErrorCode is the machine-readable code the API would answer err with (e.g.
// "digest_mismatch", "source_not_found", "shape_mismatch"), for callers that report errors
// elsewhere, such as the fleet agent's acks.
func ErrorCode(err error) string {
	if err == nil {
		return ""
	}
	return classify(err).Code
}

// Abort aborts the requests with the given client-visible (or engine) ids, or every
// request the API started when ids is empty, and returns how many engine requests it aborted.
func (a *API) Abort(ids []string) int {
	e := a.abortIDs(ids)
	a.eng.Abort(e...)
	return len(e)
}

type abortRequest struct {
	RequestIDs []string `json:"request_ids"`
}

func (a *API) handleAbortRequests(c *gin.Context) {
	var req abortRequest
	if c.Request.ContentLength != 0 {
		if err := readJSON(c, &req); err != nil {
			// An empty body means "all", like vLLM.
			var ae *Error
			if !errors.As(err, &ae) || ae.Code != "empty_body" {
				writeError(c, err)
				return
			}
		}
	}
	ids := a.abortIDs(req.RequestIDs)
	a.eng.Abort(ids...)
	c.PureJSON(http.StatusOK, gin.H{"status": "aborted", "aborted": len(ids)})
}

// stateResponse is GET /state.
type stateResponse struct {
	State            protocol.EngineState `json:"state"`
	WeightVersion    int64                `json:"weight_version"`
	StagedVersion    int64                `json:"staged_version"`
	PauseMode        string               `json:"pause_mode,omitempty"`
	SleepLevel       int                  `json:"sleep_level"`
	RequestsRunning  int                  `json:"requests_running"`
	RequestsWaiting  int                  `json:"requests_waiting"`
	HTTPInflight     int                  `json:"http_inflight"`
	HTTPQueued       int                  `json:"http_queued"`
	HTTPReading      int                  `json:"http_reading_body"`
	KVBlocksUsed     int                  `json:"kv_blocks_used"`
	KVBlocksTotal    int                  `json:"kv_blocks_total"`
	KVUsage          float64              `json:"kv_usage_ratio"`
	KVReleased       bool                 `json:"kv_released"`
	OffloadInflight  float64              `json:"offload_jobs_inflight"`
	FlushPending     float64              `json:"offload_flush_pending"`
	SafetyViolations float64              `json:"safety_violations"`
	Steps            int64                `json:"steps"`
	Connector        map[string]float64   `json:"connector,omitempty"`
}

func (a *API) handleState(c *gin.Context) {
	st, err := a.eng.Stats(c.Request.Context())
	if err != nil {
		writeError(c, err)
		return
	}
	r := stateResponse{State: a.stateName(st.State), WeightVersion: st.WeightVersion, StagedVersion: st.StagedVersion,
		PauseMode: st.PauseMode, SleepLevel: st.SleepLevel, RequestsRunning: st.Running, RequestsWaiting: st.Waiting,
		HTTPInflight: a.Inflight(), HTTPQueued: int(a.limit.queued.Load()), HTTPReading: int(a.reading.Load()),
		KVBlocksUsed: st.KVBlocksUsed, KVBlocksTotal: st.KVBlocksTotal, KVReleased: st.KVReleased,
		Steps: st.Steps, Connector: st.Connector}
	if st.KVBlocksTotal > 0 {
		r.KVUsage = float64(st.KVBlocksUsed) / float64(st.KVBlocksTotal)
	}
	r.OffloadInflight = st.Connector["offload_jobs_inflight"]
	r.FlushPending = st.Connector["offload_flush_pending"]
	r.SafetyViolations = st.Connector["safety_violations_total"]
	c.PureJSON(http.StatusOK, r)
}
