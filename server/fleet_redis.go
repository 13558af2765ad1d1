package server

import (
	"context"
	"fmt"

	"github.com/rolloutkit/rollout/sdk/bus"
)

// dialRedis opens the fleet's Redis bus.
func dialRedis(ctx context.Context, url string) (bus.Bus, error) {
	return nil, fmt.Errorf("server: dial %s: %w (the Redis bus is not in this build yet)", url, bus.ErrUnavailable)
}
