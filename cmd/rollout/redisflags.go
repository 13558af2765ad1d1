package main

import (
	"context"
	"flag"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
)

// redisFlags are the flags that say how to reach the fleet's Redis. Every command that takes
// --redis registers them through here; their one definition is redisconf.RegisterFlags.
type redisFlags struct {
	conf redisconf.Config
}

// register adds the flags to f; usage describes --redis for this command.
func (r *redisFlags) register(f *pflag.FlagSet, usage string) {
	g := flag.NewFlagSet("redis", flag.ContinueOnError)
	r.conf.RegisterFlags(g, usage)
	f.AddGoFlagSet(g)
}

// config is the flags' configuration with passwords not given otherwise taken from the
// environment.
func (r *redisFlags) config(cmd *cobra.Command) redisconf.Config {
	c := r.conf
	c.LoadEnv(lookupFrom(cmd))
	return c
}

type lookupKey struct{}

// withLookup stores the environment the root command was built with in ctx, for commands
// that read variables that are not flags (the Redis passwords).
func withLookup(ctx context.Context, lookupEnv lookupEnvFunc) context.Context {
	return context.WithValue(ctx, lookupKey{}, lookupEnv)
}

// lookupFrom returns the root command's environment, or the process's outside a run.
func lookupFrom(cmd *cobra.Command) lookupEnvFunc {
	if ctx := cmd.Context(); ctx != nil {
		if l, ok := ctx.Value(lookupKey{}).(lookupEnvFunc); ok {
			return l
		}
	}
	return os.LookupEnv
}
