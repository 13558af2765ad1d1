package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
)

// NewRootCmd builds the whole rollout command tree. It holds no package-level state, so tests
// can build as many independent trees as they like.
func NewRootCmd() *cobra.Command {
	return newRootCmd(os.LookupEnv)
}

// lookupEnvFunc has the signature of os.LookupEnv; tests pass a map-backed one.
type lookupEnvFunc func(key string) (string, bool)

type loggerKey struct{}

// newRootCmd is NewRootCmd with the environment made explicit.
func newRootCmd(lookupEnv lookupEnvFunc) *cobra.Command {
	var logLevel string
	root := &cobra.Command{
		Use:   "rollout",
		Short: "Generation side of RL training: inference engine, server, fleet control",
		Long: "Rollout serves a Llama-family inference engine with KV-cache offloading, and lets a\n" +
			"training loop pause, update and resume a fleet of such servers over Redis.\n\n" +
			"Every flag also reads ROLLOUT_<FLAG_IN_UPPER_SNAKE> from the environment\n" +
			"(flag > environment > default).",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd, lookupEnv); err != nil {
				return err
			}
			if err := setupLogging(cmd, logLevel); err != nil {
				return err
			}
			cmd.SetContext(withLookup(cmd.Context(), lookupEnv))
			return nil
		},
	}
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info",
		"log level: debug, info, warn or error")
	root.CompletionOptions.HiddenDefaultCmd = true

	addCommands(root)

	chainPersistentPreRuns(root, root.PersistentPreRunE)
	documentEnv(root)
	return root
}

// setupLogging installs the process logger (text to stderr at the requested level). It is the
// default slog logger, because library packages log through slog.Default or a logger handed to
// them, and it is also stored in the command's context for handlers that want it explicitly.
func setupLogging(cmd *cobra.Command, level string) error {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return fmt.Errorf("invalid --log-level %q: want debug, info, warn or error", level)
	}
	logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: lvl}))
	slog.SetDefault(logger)
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	cmd.SetContext(context.WithValue(ctx, loggerKey{}, logger))
	return nil
}

// loggerFrom returns the logger set up by the root command, or slog.Default outside a run.
func loggerFrom(cmd *cobra.Command) *slog.Logger {
	if ctx := cmd.Context(); ctx != nil {
		if l, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok {
			return l
		}
	}
	return slog.Default()
}

// chainPersistentPreRuns makes sure the root's setup (environment, logging) runs even when a
// subcommand declares its own PersistentPreRun(E): cobra runs only the nearest one, and the
// alternative, cobra.EnableTraverseRunHooks, is a package-level switch.
func chainPersistentPreRuns(root *cobra.Command, setup func(*cobra.Command, []string) error) {
	for _, sub := range root.Commands() {
		own := sub.PersistentPreRunE
		if own == nil && sub.PersistentPreRun != nil {
			plain := sub.PersistentPreRun
			own = func(cmd *cobra.Command, args []string) error { plain(cmd, args); return nil }
		}
		if own != nil {
			sub.PersistentPreRun = nil
			sub.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
				if err := setup(cmd, args); err != nil {
					return err
				}
				return own(cmd, args)
			}
		}
		chainPersistentPreRuns(sub, setup)
	}
}
