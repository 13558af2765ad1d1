package api

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/server/agent"
)

// Metrics is the server's Prometheus registry: histograms fed by engine hooks and the API,
// and a collector that reads the engine's lock-free counters at scrape time (a scrape never
// waits for the engine loop).
type Metrics struct {
	reg           *prometheus.Registry
	ttft          prometheus.Histogram
	resetToFlush  prometheus.Histogram
	updateWeights *prometheus.HistogramVec
	commands      *prometheus.CounterVec
	// commandsBy caches commands' children by kind and result: every server counts every
	// command, and a label lookup hashes both values each time.
	commandsBy   sync.Map // commandLabels → prometheus.Counter
	rejected     *prometheus.CounterVec
	fetched      *prometheus.CounterVec
	sourceFails  *prometheus.CounterVec
	bodyRejected *prometheus.CounterVec
	toolOutcomes *prometheus.CounterVec
}

// Peer distribution label values (rollout_weights_fetched_bytes_total{source},
// rollout_weights_source_failures_total{reason}).
const (
	SourceOrigin = "origin"
	SourcePeer   = "peer"
	// FailDied: a source broke off or answered wrongly; the fetch resumed elsewhere.
	FailDied = "died"
	// FailBadDigest: the checkpoint did not hash to its digest; it was fetched again.
	FailBadDigest = "bad_digest"
	// FailNotMember: the assigned peer is not a member of the fleet; nothing was fetched
	// from it.
	FailNotMember = "not_member"
)

// Tool-output label values (rollout_chat_tool_outputs_total{outcome}).
const (
	ToolOutcomeCalls     = "calls"
	ToolOutcomeText      = "text"
	ToolOutcomeMalformed = "malformed"
)

// Control-plane label values exported at zero from the start, so a dashboard sees every
// series before the first command (the fleet agent's kinds and reasons; see sdk/protocol).
var (
	controlKinds   = []string{"pause", "resume", "sleep", "wake", "reset", "stage", "commit", "abort"}
	controlResults = []string{"ok", "failed"}
	controlReasons = []string{"unsigned", "bad_signature", "expired", "replayed", "wrong_fleet", "malformed"}
)

// NewMetrics creates the registry with the Go and process collectors and the histograms.
func NewMetrics() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "rollout_time_to_first_token_seconds", Help: "Time from arrival to the first generated token.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	})
	m.updateWeights = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "rollout_update_weights_seconds", Help: "Duration of the phases of a weight update (fetch, stage, commit, total).",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	}, []string{"phase"})
	for _, phase := range []string{"fetch", "stage", "commit", "total"} {
		m.updateWeights.WithLabelValues(phase) // every phase is scraped from the start, at zero
	}
	m.commands = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_control_commands_total", Help: "Fleet control commands executed, by kind and result (ok, failed).",
	}, []string{"kind", "result"})
	for _, k := range controlKinds {
		for _, r := range controlResults {
			m.commands.WithLabelValues(k, r)
		}
	}
	m.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_control_rejected_total", Help: "Fleet control messages refused before acting on them, by reason.",
	}, []string{"reason"})
	for _, r := range controlReasons {
		m.rejected.WithLabelValues(r)
	}
	m.fetched = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_weights_fetched_bytes_total", Help: "Checkpoint bytes this server fetched, by source (origin, peer).",
	}, []string{"source"})
	m.sourceFails = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_weights_source_failures_total", Help: "Weight sources replaced during a fetch, by reason (died, bad_digest, not_member).",
	}, []string{"reason"})
	for _, s := range []string{SourceOrigin, SourcePeer} {
		m.fetched.WithLabelValues(s)
	}
	for _, r := range []string{FailDied, FailBadDigest, FailNotMember} {
		m.sourceFails.WithLabelValues(r)
	}
	m.bodyRejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_http_body_rejected_total", Help: "Request bodies refused, by reason: budget (the memory budget of bodies in flight was full; not read), too_large, timeout, bad_body.",
	}, []string{"reason"})
	for _, r := range []string{"budget", "too_large", "timeout", "bad_body"} {
		m.bodyRejected.WithLabelValues(r)
	}
	m.resetToFlush = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "rollout_reset_to_flush_seconds", Help: "Time from a cache reset to the moment its flush set reached the offload workers and they waited on it.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
	})
	m.toolOutcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_chat_tool_outputs_total",
		Help: "Chat choices generated with tools on, by what the output held: calls, text, or malformed (a call begun and not valid).",
	}, []string{"outcome"})
	for _, o := range []string{ToolOutcomeCalls, ToolOutcomeText, ToolOutcomeMalformed} {
		m.toolOutcomes.WithLabelValues(o)
	}
	m.reg.MustRegister(m.ttft, m.resetToFlush, m.updateWeights, m.commands, m.rejected, m.fetched, m.sourceFails, m.bodyRejected, m.toolOutcomes, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is the registry, for callers that add their own collectors (the fleet agent).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Hooks are the engine hooks that feed the TTFT histogram; pass them in engine.Config.
func (m *Metrics) Hooks() engine.Hooks {
	return engine.Hooks{OnFinish: func(_ string, _ engine.FinishReason, _, gen int, t engine.Timings) {
		if gen > 0 && !t.FirstToken.IsZero() {
			m.ttft.Observe(t.FirstToken.Sub(t.Arrival).Seconds())
		}
	}}
}

// ObserveResetToFlush records one reset's reset-to-flush latency (the offload connector's
// OnFlushDelivered callback), with the trace id of ctx's span as an exemplar.
func (m *Metrics) ObserveResetToFlush(ctx context.Context, _ []int64, d time.Duration) {
	observe(ctx, m.resetToFlush, d)
}

// ObserveUpdate records one phase of a weight update (fetch, stage, commit, total) in
// rollout_update_weights_seconds, with the trace id of ctx's span as an exemplar; the fleet
// agent reports the commits it runs through it.
func (m *Metrics) ObserveUpdate(ctx context.Context, phase string, d time.Duration) {
	observe(ctx, m.updateWeights.WithLabelValues(phase), d)
}

// observe records d, attaching the trace id of ctx's sampled span as an exemplar so a slow
// bucket in a dashboard leads to the trace that explains it (OpenMetrics scrapes only).
func observe(ctx context.Context, o prometheus.Observer, d time.Duration) {
	if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
		if eo, ok := o.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(d.Seconds(), prometheus.Labels{"trace_id": sc.TraceID().String(), "span_id": sc.SpanID().String()})
			return
		}
	}
	o.Observe(d.Seconds())
}

// CommandDone counts one fleet command this server executed (the fleet agent's hook).
func (m *Metrics) CommandDone(kind, result string) {
	k := commandLabels{kind, result}
	c, ok := m.commandsBy.Load(k)
	if !ok { // the labels may be substrings of a whole message: keep copies
		k = commandLabels{strings.Clone(kind), strings.Clone(result)}
		c, _ = m.commandsBy.LoadOrStore(k, m.commands.WithLabelValues(k.kind, k.result))
	}
	c.(prometheus.Counter).Inc()
}

// commandLabels are the label values of one rollout_control_commands_total child.
type commandLabels struct{ kind, result string }

// Fetched counts n checkpoint bytes fetched from source (SourceOrigin, SourcePeer).
func (m *Metrics) Fetched(source string, n int64) { m.fetched.WithLabelValues(source).Add(float64(n)) }

// SourceFailed counts one weight source replaced, by reason (FailDied, FailBadDigest,
// FailNotMember).
func (m *Metrics) SourceFailed(reason string) { m.sourceFails.WithLabelValues(reason).Inc() }

// ToolOutput counts one chat choice generated with tools on, by outcome (ToolOutcomeCalls,
// ToolOutcomeText, ToolOutcomeMalformed): a rising malformed share is a model losing the
// call format.
func (m *Metrics) ToolOutput(outcome string) { m.toolOutcomes.WithLabelValues(outcome).Inc() }

// Rejected counts one fleet control message this server refused, by reason.
func (m *Metrics) Rejected(reason string) { m.rejected.WithLabelValues(reason).Inc() }

// handler serves the registry; a scraper that asks for OpenMetrics (Prometheus does when
// exemplar storage is on) gets the exemplars too, anyone else the classic text format.
func (m *Metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{EnableOpenMetrics: true})
}

// bind registers the scrape-time collector of a's engine and connector.
func (m *Metrics) bind(a *API) { _ = m.reg.Register(&engineCollector{a: a}) }

var (
	descRunning      = prometheus.NewDesc("rollout_requests_running", "Requests in the running batch.", nil, nil)
	descWaiting      = prometheus.NewDesc("rollout_requests_waiting", "Requests waiting to be scheduled.", nil, nil)
	descRequests     = prometheus.NewDesc("rollout_requests_total", "Finished requests by finish reason.", []string{"finish_reason"}, nil)
	descPromptTok    = prometheus.NewDesc("rollout_prompt_tokens_total", "Prompt tokens of admitted requests.", nil, nil)
	descGenTok       = prometheus.NewDesc("rollout_generation_tokens_total", "Generated tokens.", nil, nil)
	descKVUsage      = prometheus.NewDesc("rollout_kv_usage_ratio", "Fraction of KV blocks owned by requests.", nil, nil)
	descPrefixQ      = prometheus.NewDesc("rollout_prefix_cache_queries_total", "Prefix cache queries, in tokens.", nil, nil)
	descPrefixH      = prometheus.NewDesc("rollout_prefix_cache_hits_total", "Prefix cache hits, in tokens.", nil, nil)
	descSteps        = prometheus.NewDesc("rollout_engine_steps_total", "Engine steps.", nil, nil)
	descVersion      = prometheus.NewDesc("rollout_weight_version", "Serving weight version.", nil, nil)
	descState        = prometheus.NewDesc("rollout_engine_state", "1 for the engine's current state.", []string{"state"}, nil)
	descHTTPInflight = prometheus.NewDesc("rollout_http_requests_inflight", "Generation requests admitted by the HTTP API.", nil, nil)
	descBodyBytes    = prometheus.NewDesc("rollout_http_body_bytes_inflight", "Bytes of the request body memory budget held by requests (--max-body-bytes-inflight bounds it).", nil, nil)
	descBodyReading  = prometheus.NewDesc("rollout_http_requests_reading_body", "Requests reading their body.", nil, nil)
)

// connectorHelp documents the connector counters docs/metrics.md lists; every other key the connector
// reports is exported as rollout_<key> too.
var connectorHelp = map[string]string{
	"offload_jobs_inflight":         "Offload transfer jobs in flight.",
	"offload_flush_pending":         "Job ids in the flush set not yet delivered to the workers.",
	"offload_flush_delivered_total": "Job ids delivered to the workers in flush sets (an empty set adds 0).",
	"offload_resets_total":          "Connector resets.",
	"offload_stored_bytes_total":    "Bytes stored to CPU.",
	"offload_loaded_bytes_total":    "Bytes loaded from CPU.",
	"offload_hit_tokens_total":      "Prompt tokens served from offloaded KV.",
	"safety_violations_total":       "Transfers that touched a released or reassigned block or slot.",
}

// engineStates are the states the rollout_engine_state gauge has a series for (a stopping
// server is gone before a scrape would matter).
var engineStates = [...]protocol.EngineState{protocol.StateRunning, protocol.StatePaused, protocol.StateSleeping, protocol.StateUpdating}

type engineCollector struct{ a *API }

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	// Unchecked collector: the connector's metric set is only known at scrape time.
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.a.eng.Metrics()
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
	}
	gauge(descRunning, float64(s.Running))
	gauge(descWaiting, float64(s.Waiting))
	counter(descRequests, float64(s.FinishedStop), string(engine.FinishStop))
	counter(descRequests, float64(s.FinishedLength), string(engine.FinishLength))
	counter(descRequests, float64(s.FinishedAbort), string(engine.FinishAbort))
	counter(descPromptTok, float64(s.PromptTokens))
	counter(descGenTok, float64(s.GenerationTokens))
	ratio := 0.0
	if s.KVTotalBlocks > 0 {
		ratio = float64(s.KVUsedBlocks) / float64(s.KVTotalBlocks)
	}
	gauge(descKVUsage, ratio)
	counter(descPrefixQ, float64(s.PrefixQueries))
	counter(descPrefixH, float64(s.PrefixHits))
	counter(descSteps, float64(s.Steps))
	gauge(descVersion, float64(s.WeightVersion))
	cur := c.a.stateName(s.State)
	for _, st := range engineStates {
		v := 0.0
		if st == cur {
			v = 1
		}
		gauge(descState, v, string(st))
	}
	gauge(descHTTPInflight, float64(c.a.Inflight()))
	gauge(descBodyBytes, float64(c.a.budget.used.Load()))
	gauge(descBodyReading, float64(c.a.reading.Load()))
	if c.a.cfg.ConnectorStats == nil {
		return
	}
	stats := c.a.cfg.ConnectorStats()
	keys := slices.Sorted(maps.Keys(stats))
	for _, k := range keys {
		help := connectorHelp[k]
		if help == "" {
			help = "Connector counter " + k + "."
		}
		d := prometheus.NewDesc("rollout_"+k, help, nil, nil)
		if strings.HasSuffix(k, "_total") {
			counter(d, stats[k])
		} else {
			gauge(d, stats[k])
		}
	}
}

// stateName is the engine state as the protocol names it, or StateUpdating while a weight
// update runs.
func (a *API) stateName(s engine.State) protocol.EngineState {
	if a.updating.Load() {
		return protocol.StateUpdating
	}
	return agent.WireState(s)
}
