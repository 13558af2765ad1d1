package embedded

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/rolloutkit/rollout/engine/load"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/server"
)

// MaxServers bounds Options.Servers: every server is a whole engine in this process.
const MaxServers = 256

// ErrInvalid wraps every bad option.
var ErrInvalid = errors.New("embedded: invalid options")

// Options configure an embedded fleet.
type Options struct {
	// Servers is the number of servers (default 1).
	Servers int
	// Model is every server's model spec (default load.DefaultSpec).
	Model string
	// Fleet is the fleet name (default "embedded").
	Fleet string
	// Secret signs the fleet's messages (at least 32 bytes; empty: a random one, which
	// DialOptions carries).
	Secret []byte
	// Server, when set, adjusts server i's config before it starts (sizes, weights root,
	// initial weight version...). The bus, fleet, id and secret are set already.
	Server func(i int, c *server.Config)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Bus, when set, is used instead of a fresh in-process bus (e.g. a Redis bus, to measure
	// the same fleet over Redis). The fleet does not close it.
	Bus bus.Bus
}

// Fleet is a running embedded fleet. Close it when done.
type Fleet struct {
	opts    Options
	bus     bus.Bus
	mem     *bus.Mem // the fleet's own bus (nil when Options.Bus was given)
	servers []*server.Server
	ids     []string

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	mu        sync.Mutex
	errs      []error
	closeOnce sync.Once
}

// Start starts the servers and returns once every one heartbeats in rotation. ctx bounds the
// start-up only: the fleet runs until Close.
func Start(ctx context.Context, o Options) (*Fleet, error) {
	if o.Servers == 0 {
		o.Servers = 1
	}
	if o.Servers < 0 || o.Servers > MaxServers {
		return nil, fmt.Errorf("%w: servers must be in [1, %d] (got %d)", ErrInvalid, MaxServers, o.Servers)
	}
	if o.Model == "" {
		o.Model = load.DefaultSpec
	}
	if o.Fleet == "" {
		o.Fleet = "embedded"
	}
	if err := protocol.CheckSecret(o.Secret); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if len(o.Secret) == 0 {
		// A fleet is signed by default: an in-process one gets a random secret, which
		// DialOptions hands to the trainer's client.
		o.Secret = make([]byte, protocol.MinSecretBytes)
		_, _ = rand.Read(o.Secret) // crypto/rand.Read never fails (Go >= 1.24)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f := &Fleet{opts: o, bus: o.Bus}
	if f.bus == nil {
		f.mem = bus.NewMem(bus.MemOptions{})
		f.bus = f.mem
	}
	for i := range o.Servers {
		id := "s" + strconv.Itoa(i)
		cfg := server.Config{Model: o.Model, Addr: "127.0.0.1:0", Bus: f.bus, Fleet: o.Fleet, ServerID: id,
			FleetSecret: string(o.Secret), ShutdownGrace: 5 * time.Second, Logger: o.Logger.With("server", id)}
		if o.Server != nil {
			o.Server(i, &cfg)
		}
		s, err := server.New(cfg)
		if err != nil {
			for _, s := range f.servers {
				_ = s.Close()
			}
			f.closeBus()
			return nil, fmt.Errorf("embedded: server %d: %w", i, err)
		}
		f.servers = append(f.servers, s)
		f.ids = append(f.ids, cfg.ServerID)
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f.cancel = cancel
	for _, s := range f.servers {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			if err := s.Run(runCtx); err != nil {
				f.mu.Lock()
				f.errs = append(f.errs, err)
				f.mu.Unlock()
			}
		}()
	}
	if err := f.waitInRotation(ctx); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// waitInRotation polls the heartbeat keys until every server reports itself in rotation.
func (f *Fleet) waitInRotation(ctx context.Context) error {
	names := protocol.Names{Fleet: f.opts.Fleet}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		kv, err := f.bus.Scan(ctx, names.HeartbeatPrefix())
		if err != nil {
			return fmt.Errorf("embedded: waiting for heartbeats: %w", err)
		}
		ready := 0
		for _, id := range f.ids {
			raw, ok := kv[names.Heartbeat(id)]
			if !ok {
				continue
			}
			if hb, err := protocol.DecodeHeartbeat(raw); err == nil && hb.InRotation {
				ready++
			}
		}
		if ready == len(f.ids) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("embedded: %d of %d servers in rotation: %w", ready, len(f.ids), ctx.Err())
		case <-tick.C:
		}
	}
}

// DialOptions returns the options sdk.Dial needs for this fleet: its bus (which the client
// does not close), name and secret.
func (f *Fleet) DialOptions() sdk.Options {
	return sdk.Options{Bus: f.bus, Fleet: f.opts.Fleet, Secret: f.opts.Secret, Logger: f.opts.Logger}
}

// Dial is sdk.Dial(ctx, f.DialOptions()).
func (f *Fleet) Dial(ctx context.Context) (*sdk.Client, error) { return sdk.Dial(ctx, f.DialOptions()) }

// Servers returns the fleet's servers, in id order (s0, s1, ...).
func (f *Fleet) Servers() []*server.Server { return append([]*server.Server(nil), f.servers...) }

// IDs returns the servers' fleet ids, in the order of Servers.
func (f *Fleet) IDs() []string { return append([]string(nil), f.ids...) }

// Bus is the fleet's bus (its in-process bus unless Options.Bus was given).
func (f *Fleet) Bus() bus.Bus { return f.bus }

func (f *Fleet) closeBus() {
	if f.mem != nil {
		_ = f.mem.Close()
	}
}

// Close shuts every server down (gracefully, as on a signal), waits for them and closes the
// bus. It returns the servers' shutdown errors, if any.
func (f *Fleet) Close() error {
	f.closeOnce.Do(func() {
		f.cancel()
		f.wg.Wait()
		f.closeBus()
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	return errors.Join(f.errs...)
}
