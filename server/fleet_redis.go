package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"

	"github.com/rolloutkit/rollout/sdk/bus"
)

// checkRedisURL refuses a URL DialRedis could never use, at start-up rather than in the
// agent's retry loop (which is for a Redis that is down, not misconfigured).
func checkRedisURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%w: --redis %q: %w", ErrInvalidConfig, raw, err)
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" || u.Host == "" {
		return fmt.Errorf("%w: --redis %q: want redis://host:port or rediss://host:port", ErrInvalidConfig, raw)
	}
	return nil
}

// dialRedis opens the fleet's Redis bus for the agent (which redials while it fails).
func dialRedis(ctx context.Context, url, serverID string, log *slog.Logger) (bus.Bus, error) {
	b, err := bus.DialRedis(ctx, url, bus.RedisOptions{ClientName: "rollout-serve-" + serverID, Logger: log})
	if err != nil {
		return nil, err
	}
	return b, nil
}
