package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// envPrefix starts every environment variable that sets a flag.
const envPrefix = "ROLLOUT_"

// envName maps a flag name to its environment variable: --max-tokens → ROLLOUT_MAX_TOKENS.
func envName(flag string) string {
	return envPrefix + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(flag))
}

// skipEnv reports flags that have no environment variable: asking for help is not
// configuration.
func skipEnv(f *pflag.Flag) bool { return f.Name == "help" }

// applyEnv gives every flag of the command being run that was not set on the command line the
// value of its environment variable, if that is set and non-empty, so the precedence is
// flag > environment > default. It goes through FlagSet.Set, so a value from the environment
// counts as given: it satisfies MarkFlagRequired and takes part in flag-group checks.
func applyEnv(cmd *cobra.Command, lookupEnv lookupEnvFunc) error {
	var firstErr error
	// cmd.Flags() holds the command's own flags and, after parsing, the persistent flags it
	// inherits, so one walk covers everything that applies to this invocation.
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if firstErr != nil || f.Changed || skipEnv(f) {
			return
		}
		key := envName(f.Name)
		v, ok := lookupEnv(key)
		if !ok || v == "" {
			return
		}
		if err := cmd.Flags().Set(f.Name, v); err != nil {
			firstErr = fmt.Errorf("environment variable %s=%q: invalid value for --%s: %w", key, v, f.Name, err)
		}
	})
	return firstErr
}

// documentEnv appends "(env ROLLOUT_X)" to the usage of every flag in the tree, so --help
// lists the variable next to the flag it sets. It is idempotent.
func documentEnv(root *cobra.Command) {
	annotate := func(f *pflag.Flag) {
		if skipEnv(f) {
			return
		}
		note := "(env " + envName(f.Name) + ")"
		if !strings.Contains(f.Usage, note) {
			f.Usage = strings.TrimSpace(f.Usage + " " + note)
		}
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(annotate)
		c.PersistentFlags().VisitAll(annotate)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
