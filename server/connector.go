package server

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/kvconnector"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/offload"
	"go.opentelemetry.io/otel/trace"
)

// connector is the wiring of the KV offloading connector: its two engine-facing sides and its
// counters for /metrics and /state.
type connector struct {
	c         *offload.Connector
	scheduler kvconnector.Scheduler
	worker    kvconnector.Worker
}

// newConnector builds the offloading connector when cfg asks for one (nil otherwise). Its CPU
// tier is allocated when the engine binds the KV storage.
func newConnector(cfg Config, mc model.Config, log *slog.Logger, tp trace.TracerProvider, onFlush func(context.Context, []int64, time.Duration)) (*connector, error) {
	if cfg.OffloadCPUBytes == 0 {
		return nil, nil
	}
	blockSize := cfg.BlockSize
	if blockSize == 0 {
		blockSize = engine.DefaultBlockSize
	}
	blockBytes := mc.KVBlockBytes(blockSize)
	c, err := offload.New(offload.Config{CPUBytes: cfg.OffloadCPUBytes, BlockSize: blockSize, Delay: cfg.OffloadDelay,
		BlockBytes: blockBytes, Logger: log, TracerProvider: tp, OnFlushDelivered: onFlush})
	if err != nil {
		return nil, fmt.Errorf("%w: --offload-cpu-bytes %d: %w", ErrInvalidConfig, cfg.OffloadCPUBytes, err)
	}
	return &connector{c: c, scheduler: c.Scheduler(), worker: c.Worker()}, nil
}

// stats reads the connector's counters; they are atomics, safe from any goroutine.
func (c *connector) stats() map[string]float64 { return maps.Clone(map[string]float64(c.c.Stats())) }
