package pipeline

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Group outcomes, the label values of rollout_pipeline_groups_total.
const (
	outcomeAdmitted = "admitted"
	outcomeConsumed = "consumed"
	outcomeFiltered = "filtered"
	outcomeStale    = "stale"
	outcomeFailed   = "failed"
)

// Metrics are a pipeline's Prometheus metrics (docs/metrics.md). A nil *Metrics records
// nothing.
type Metrics struct {
	buffer, inflight prometheus.Gauge
	groups           *prometheus.CounterVec
	staleness        prometheus.Histogram
	verify           prometheus.Histogram
	verifyErrors     *prometheus.CounterVec
	wait             prometheus.Histogram
}

// NewMetrics registers the pipeline metrics with reg (every labelled series starts at 0).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		buffer: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rollout_pipeline_buffer_groups",
			Help: "Finished groups waiting for a batch."}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rollout_pipeline_inflight_groups",
			Help: "Groups generating or being scored."}),
		groups: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollout_pipeline_groups_total",
			Help: "Groups by outcome: admitted, consumed, filtered (zero reward variance), stale (past the staleness bound), failed (verifier error)."},
			[]string{"outcome"}),
		staleness: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rollout_pipeline_staleness_versions",
			Help:    "Trainer version minus the oldest token's weight version, per consumed group.",
			Buckets: []float64{0, 1, 2, 3, 4, 6, 8, 16}}),
		verify: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rollout_pipeline_verify_seconds",
			Help: "Verifier call latency.", Buckets: prometheus.ExponentialBuckets(1e-5, 4, 12)}),
		verifyErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollout_pipeline_verify_errors_total",
			Help: "Verifier calls that failed, by kind: error or timeout."}, []string{"kind"}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rollout_pipeline_batch_wait_seconds",
			Help: "How long the trainer waited in Next for a batch.", Buckets: prometheus.ExponentialBuckets(1e-4, 4, 12)}),
	}
	for _, o := range []string{outcomeAdmitted, outcomeConsumed, outcomeFiltered, outcomeStale, outcomeFailed} {
		m.groups.WithLabelValues(o)
	}
	m.verifyErrors.WithLabelValues("error")
	m.verifyErrors.WithLabelValues("timeout")
	for _, c := range []prometheus.Collector{m.buffer, m.inflight, m.groups, m.staleness, m.verify, m.verifyErrors, m.wait} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("pipeline metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) setDepth(buffer, inflight int) {
	if m != nil {
		m.buffer.Set(float64(buffer))
		m.inflight.Set(float64(inflight))
	}
}

func (m *Metrics) outcome(o string, n int) {
	if m != nil {
		m.groups.WithLabelValues(o).Add(float64(n))
	}
}

func (m *Metrics) consumed(staleness int64) {
	if m != nil {
		m.groups.WithLabelValues(outcomeConsumed).Inc()
		m.staleness.Observe(float64(staleness))
	}
}

func (m *Metrics) verified(d time.Duration, err error) {
	if m == nil {
		return
	}
	m.verify.Observe(d.Seconds())
	switch {
	case errors.Is(err, ErrVerifierTimeout):
		m.verifyErrors.WithLabelValues("timeout").Inc()
	case err != nil:
		m.verifyErrors.WithLabelValues("error").Inc()
	}
}

func (m *Metrics) batchWait(d time.Duration) {
	if m != nil {
		m.wait.Observe(d.Seconds())
	}
}
