package server

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
)

// checkRedis refuses a Redis configuration the bus could never use (a bad URL, an unreadable
// CA or password file, ...), at start-up rather than in the agent's retry loop (which is for
// a Redis that is down, not misconfigured). The error never holds the password.
func (c *Config) checkRedis() error {
	if _, err := c.Redis.Resolve(); err != nil {
		return fmt.Errorf("%w: --redis: %w", ErrInvalidConfig, err)
	}
	return nil
}

// dialRedis opens the fleet's Redis bus for the agent (which redials while it fails).
func dialRedis(ctx context.Context, conf redisconf.Config, serverID string, log *slog.Logger) (bus.Bus, error) {
	b, err := bus.DialRedisConfig(ctx, conf, bus.RedisOptions{ClientName: "rollout-serve-" + serverID, Logger: log})
	if err != nil {
		return nil, err
	}
	return b, nil
}
