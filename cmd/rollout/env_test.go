package main

import (
	"bytes"
	"log/slog"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// probe is what the test subcommand saw once flags and environment were applied.
type probe struct {
	maxTokens int
	temp      float64
	timeout   time.Duration
	json      bool
	model     string
}

// newProbeRoot builds the real root with env from the map and one extra subcommand, "probe",
// whose flags exercise the main pflag value kinds.
func newProbeRoot(env map[string]string, got *probe) *cobra.Command {
	root := newRootCmd(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	cmd := &cobra.Command{
		Use:  "probe",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error { return nil },
	}
	cmd.Flags().IntVar(&got.maxTokens, "max-tokens", 16, "tokens to generate")
	cmd.Flags().Float64Var(&got.temp, "temperature", 1, "sampling temperature")
	cmd.Flags().DurationVar(&got.timeout, "timeout", time.Minute, "deadline")
	cmd.Flags().BoolVar(&got.json, "json", false, "JSON output")
	cmd.Flags().StringVar(&got.model, "model", "builtin:tiny", "model")
	root.AddCommand(cmd)
	documentEnv(root)
	return root
}

func execute(t *testing.T, root *cobra.Command, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errb)
	err = root.ExecuteContext(t.Context())
	return out.String(), errb.String(), err
}

func TestEnvName(t *testing.T) {
	for flag, want := range map[string]string{
		"max-tokens":        "ROLLOUT_MAX_TOKENS",
		"log-level":         "ROLLOUT_LOG_LEVEL",
		"json":              "ROLLOUT_JSON",
		"offload-cpu-bytes": "ROLLOUT_OFFLOAD_CPU_BYTES",
	} {
		assert.Equal(t, want, envName(flag), flag)
	}
}

func TestEnvPrecedence(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want probe
	}{
		{
			name: "defaults",
			want: probe{maxTokens: 16, temp: 1, timeout: time.Minute, model: "builtin:tiny"},
		},
		{
			name: "env over default",
			env: map[string]string{
				"ROLLOUT_MAX_TOKENS": "64", "ROLLOUT_TEMPERATURE": "0.5", "ROLLOUT_TIMEOUT": "3s",
				"ROLLOUT_JSON": "true", "ROLLOUT_MODEL": "/tmp/m",
			},
			want: probe{maxTokens: 64, temp: 0.5, timeout: 3 * time.Second, json: true, model: "/tmp/m"},
		},
		{
			name: "flag over env",
			env:  map[string]string{"ROLLOUT_MAX_TOKENS": "64", "ROLLOUT_JSON": "true"},
			args: []string{"--max-tokens", "8", "--json=false"},
			want: probe{maxTokens: 8, temp: 1, timeout: time.Minute, model: "builtin:tiny"},
		},
		{
			name: "empty env is unset",
			env:  map[string]string{"ROLLOUT_MAX_TOKENS": ""},
			want: probe{maxTokens: 16, temp: 1, timeout: time.Minute, model: "builtin:tiny"},
		},
		{
			name: "unrelated env ignored",
			env:  map[string]string{"MAX_TOKENS": "3", "ROLLOUT_MAXTOKENS": "4"},
			want: probe{maxTokens: 16, temp: 1, timeout: time.Minute, model: "builtin:tiny"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got probe
			_, _, err := execute(t, newProbeRoot(tt.env, &got), append([]string{"probe"}, tt.args...)...)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestEnvInvalidValueNamesVariable(t *testing.T) {
	var got probe
	_, _, err := execute(t, newProbeRoot(map[string]string{"ROLLOUT_MAX_TOKENS": "lots"}, &got), "probe")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ROLLOUT_MAX_TOKENS")
	assert.Contains(t, err.Error(), `"lots"`)
	assert.Contains(t, err.Error(), "--max-tokens")
}

func TestEnvPersistentFlag(t *testing.T) {
	var got probe
	_, _, err := execute(t, newProbeRoot(map[string]string{"ROLLOUT_LOG_LEVEL": "loud"}, &got), "probe")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "log-level")

	root := newProbeRoot(map[string]string{"ROLLOUT_LOG_LEVEL": "debug"}, &got)
	_, _, err = execute(t, root, "probe")
	require.NoError(t, err)
	probeCmd, _, err := root.Find([]string{"probe"})
	require.NoError(t, err)
	assert.Equal(t, "debug", probeCmd.Flag("log-level").Value.String())
	assert.True(t, loggerFrom(probeCmd).Enabled(t.Context(), slog.LevelDebug), "debug level enabled")
}

func TestEnvSatisfiesRequiredFlag(t *testing.T) {
	build := func(env map[string]string, out *string) *cobra.Command {
		root := newRootCmd(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		cmd := &cobra.Command{Use: "need", RunE: func(*cobra.Command, []string) error { return nil }}
		cmd.Flags().StringVar(out, "out", "", "output dir")
		require.NoError(t, cmd.MarkFlagRequired("out"))
		root.AddCommand(cmd)
		return root
	}
	var out string
	_, _, err := execute(t, build(nil, &out), "need")
	require.Error(t, err, "required flag missing")

	_, _, err = execute(t, build(map[string]string{"ROLLOUT_OUT": "/tmp/x"}, &out), "need")
	require.NoError(t, err)
	assert.Equal(t, "/tmp/x", out)
}

func TestEnvAppliedDespiteSubcommandHook(t *testing.T) {
	// A subcommand with its own PersistentPreRun would normally shadow the root's hook (cobra
	// runs only the nearest one); newRootCmd chains them so env and logging still happen first.
	env := map[string]string{"ROLLOUT_N": "7"}
	var n, seenInHook int
	sub := &cobra.Command{
		Use:              "hooked",
		PersistentPreRun: func(*cobra.Command, []string) { seenInHook = n },
		RunE:             func(*cobra.Command, []string) error { return nil },
	}
	sub.Flags().IntVar(&n, "n", 1, "count")
	root := newRootCmd(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	root.AddCommand(sub)
	chainPersistentPreRuns(root, root.PersistentPreRunE) // what newRootCmd does after addCommands

	_, _, err := execute(t, root, "hooked")
	require.NoError(t, err)
	assert.Equal(t, 7, seenInHook, "root setup ran before the subcommand's own hook, which still ran")
}

func TestHelpListsEnvNames(t *testing.T) {
	var got probe
	out, _, err := execute(t, newProbeRoot(nil, &got), "probe", "--help")
	require.NoError(t, err)
	for _, name := range []string{"ROLLOUT_MAX_TOKENS", "ROLLOUT_TEMPERATURE", "ROLLOUT_JSON", "ROLLOUT_LOG_LEVEL"} {
		assert.Contains(t, out, "(env "+name+")")
	}
	assert.NotContains(t, out, "ROLLOUT_HELP")
	// Annotating twice must not duplicate the note.
	root := newProbeRoot(nil, &got)
	documentEnv(root)
	out, _, err = execute(t, root, "probe", "--help")
	require.NoError(t, err)
	assert.Equal(t, 1, bytes.Count([]byte(out), []byte("(env ROLLOUT_MAX_TOKENS)")))
}

func TestEveryRegisteredFlagDocumentsEnv(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		check := func(f *pflag.Flag) {
			if f.Name != "help" {
				assert.Contains(t, f.Usage, "(env "+envName(f.Name)+")", "%s --%s", c.CommandPath(), f.Name)
			}
		}
		c.Flags().VisitAll(check)
		c.PersistentFlags().VisitAll(check)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(NewRootCmd())
}
