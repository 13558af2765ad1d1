package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/sdk/telemetry"
)

// fleetConn holds the flags that say which fleet to talk to: every fleet subcommand and
// `generate --redis` take them.
type fleetConn struct {
	redis              redisFlags
	fleet              string
	secret, secretFile string
	insecure           bool // --insecure-unsigned-fleet
	// apiKey is the servers' API key, for the generation routes (generate's --api-key).
	apiKey string
}

func (c *fleetConn) register(cmd *cobra.Command, persistent bool) {
	f := cmd.Flags()
	if persistent {
		f = cmd.PersistentFlags()
	}
	c.redis.register(f, "Redis of the fleet's control plane")
	f.StringVar(&c.fleet, "fleet", "", "fleet name the servers were started with")
	f.StringVar(&c.secret, "fleet-secret", "", "HMAC secret of the fleet (at least 32 bytes; empty for an unsigned fleet)")
	f.StringVar(&c.secretFile, "fleet-secret-file", "", "file holding the fleet secret (trailing newline ignored), so it stays out of ps")
	f.BoolVar(&c.insecure, "insecure-unsigned-fleet", false, "talk to a fleet run without a secret (refused without this flag)")
}

// dial checks the flags and connects; sdk.Dial itself fails fast on an unreachable Redis or
// a secret that does not verify the fleet's state.
func (c *fleetConn) dial(ctx context.Context, cmd *cobra.Command) (*sdk.Client, error) {
	if c.redis.conf.URL == "" {
		return nil, fmt.Errorf("--redis is required (or %s)", envName("redis"))
	}
	if c.fleet == "" {
		return nil, fmt.Errorf("--fleet is required (or %s)", envName("fleet"))
	}
	secret := c.secret
	if c.secretFile != "" {
		if secret != "" {
			return nil, fmt.Errorf("--fleet-secret and --fleet-secret-file are exclusive")
		}
		s, err := readSecretFile(c.secretFile)
		if err != nil {
			return nil, fmt.Errorf("--fleet-secret-file: %w", err)
		}
		secret = s
	}
	cl, err := sdk.Dial(ctx, sdk.Options{Redis: c.redis.config(cmd), Fleet: c.fleet, Secret: []byte(secret), Logger: loggerFrom(cmd),
		InsecureUnsigned: c.insecure, APIKey: c.apiKey})
	if err != nil {
		return nil, fmt.Errorf("fleet %q: %w", c.fleet, err)
	}
	return cl, nil
}

// fleetCmd is the state shared by the fleet subcommands.
type fleetCmd struct {
	conn   fleetConn
	asJSON bool
}

func newFleetCmd() *cobra.Command {
	fc := &fleetCmd{}
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Inspect and drive a fleet of rollout servers over Redis: status, pause, resume, sleep, wake, reset, update",
		Long: "Each subcommand signs its commands with the fleet secret, publishes them on the fleet's\n" +
			"Redis channel and waits for every target server's ack. It prints a per-server table (or\n" +
			"JSON with --json) and exits 1 when any target failed.",
	}
	fc.conn.register(cmd, true)
	cmd.PersistentFlags().BoolVar(&fc.asJSON, "json", false, "print JSON instead of a table")
	cmd.AddCommand(fc.statusCmd(), fc.pauseCmd(), fc.resumeCmd(), fc.sleepCmd(), fc.wakeCmd(), fc.resetCmd(), fc.updateCmd(), fc.keysCmd())
	return cmd
}

// withClient dials, runs f and closes the client. Tracing follows the standard OTEL_*
// variables (OTEL_TRACES_EXPORTER=otlp exports the command's sdk.* spans, whose context the
// servers continue), flushed before the command exits.
func (fc *fleetCmd) withClient(cmd *cobra.Command, f func(context.Context, *sdk.Client) error) error {
	ctx := cmd.Context()
	_, shutdown, err := telemetry.Setup(ctx, telemetry.Options{ServiceName: "rollout-fleet", Stdout: cmd.ErrOrStderr()})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			loggerFrom(cmd).Warn("flushing traces", "err", err)
		}
	}()
	c, err := fc.conn.dial(ctx, cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	return f(ctx, c)
}

func (fc *fleetCmd) writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// statusView is what `fleet status --json` prints: the SDK's DesiredState and Status results.
type statusView struct {
	Fleet   string                 `json:"fleet"`
	Desired *protocol.DesiredState `json:"desired,omitempty"`
	Servers []serverStatusView     `json:"servers"`
}

// serverStatusView is sdk.ServerStatus (its JSON form) with the heartbeat's age in
// milliseconds beside Age's nanoseconds, for people reading the output.
type serverStatusView struct {
	sdk.ServerStatus
	AgeMs float64 `json:"age_ms"`
}

func (fc *fleetCmd) statusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "List the fleet's live servers: state, rotation, serving and staged version, load",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fc.withClient(cmd, func(ctx context.Context, c *sdk.Client) error {
				d, err := c.DesiredState(ctx)
				if err != nil {
					return fmt.Errorf("fleet status: %w", err)
				}
				st, err := c.Status(ctx)
				if err != nil {
					return fmt.Errorf("fleet status: %w", err)
				}
				view := statusView{Fleet: c.Fleet(), Desired: d, Servers: make([]serverStatusView, len(st))}
				for i, s := range st {
					view.Servers[i] = serverStatusView{ServerStatus: s, AgeMs: ms(s.Age)}
				}
				out := cmd.OutOrStdout()
				if fc.asJSON {
					return fc.writeJSON(out, view)
				}
				fmt.Fprintf(out, "fleet %s: %s\n", c.Fleet(), describeDesired(d))
				if len(st) == 0 {
					fmt.Fprintln(out, "no live servers")
					return nil
				}
				tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "SERVER\tSTATE\tIN ROTATION\tVERSION\tSTAGED\tRUNNING\tWAITING\tKV\tAGE\tURL\tERROR")
				for _, s := range st {
					ver := fmt.Sprint(s.WeightVersion)
					if s.Stale {
						ver += " (stale)"
					}
					fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\t%d\t%d\t%.0f%%\t%s\t%s\t%s\n", s.ID, s.State, s.InRotation, ver,
						optInt(s.StagedVersion), s.Running, s.Waiting, 100*s.KVUsage, s.Age.Round(time.Millisecond), s.AdvertiseURL, oneLine(s.Error))
				}
				return tw.Flush()
			})
		},
	}
}

func describeDesired(d *protocol.DesiredState) string {
	if d == nil {
		return "no desired state yet"
	}
	v := "the versions the servers started with"
	if d.Weights != nil {
		v = fmt.Sprintf("version %d from %s", d.Weights.Version, d.Weights.URI)
	}
	return fmt.Sprintf("desired %s (epoch %d), paused %v, signed %v", v, d.Epoch, d.Paused, d.Signed)
}

// controlFlags are the flags of the one-command subcommands.
type controlFlags struct {
	targets []string
	timeout time.Duration
}

func (f *controlFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringSliceVar(&f.targets, "targets", nil, "server ids to send the command to (default: every live server; with targets the fleet's desired state is left alone)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", sdk.DefaultCommandTimeout, "how long to wait for every target's ack")
}

func (f *controlFlags) call() sdk.Call {
	return sdk.Call{Targets: f.targets, Timeout: f.timeout}
}

// controlView is what the one-command subcommands print with --json: the SDK's per-server
// results as the control call returned them (sdk.ServerResult's JSON form) and the call's
// outcome.
type controlView struct {
	Fleet   string             `json:"fleet"`
	Command string             `json:"command"`
	OK      bool               `json:"ok"`
	Error   string             `json:"error,omitempty"`
	Servers []sdk.ServerResult `json:"servers"`
}

// resultText is a result's RESULT column: the server's result, or "no ack".
func resultText(r sdk.ServerResult) string {
	if r.Result == "" {
		return "no ack"
	}
	return string(r.Result)
}

// errorText is an error's message ("" for nil).
func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// control runs one command through call and prints its per-server results. A failure with
// results (some targets failed) prints them and then returns the error, so the exit code is 1;
// a failure without (bad flags, no servers) is just the error.
func (fc *fleetCmd) control(cmd *cobra.Command, name string, f controlFlags, call func(context.Context, *sdk.Client, sdk.Call) ([]sdk.ServerResult, error)) error {
	return fc.withClient(cmd, func(ctx context.Context, c *sdk.Client) error {
		results, err := call(ctx, c, f.call())
		if err != nil && len(results) == 0 {
			return fmt.Errorf("fleet %s: %w", name, err)
		}
		out := cmd.OutOrStdout()
		if fc.asJSON {
			v := controlView{Fleet: c.Fleet(), Command: name, OK: err == nil, Error: errorText(err), Servers: results}
			if jerr := fc.writeJSON(out, v); jerr != nil {
				return jerr
			}
		} else {
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "SERVER\tRESULT\tVERSION\tLATENCY\tPHASES\tERROR")
			for _, r := range results {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", r.ServerID, resultText(r), r.WeightVersion, r.Latency.Round(10*time.Microsecond),
					phaseList(r.Phases), oneLine(errorText(r.Err)))
			}
			if ferr := tw.Flush(); ferr != nil {
				return ferr
			}
		}
		if err != nil {
			return fmt.Errorf("fleet %s: %w", name, err)
		}
		return nil
	})
}

func phaseList(ps []protocol.Phase) string {
	parts := make([]string, 0, len(ps))
	for _, p := range ps {
		s := fmt.Sprintf("%s %.1fms", p.Name, p.Seconds*1e3)
		if !p.OK {
			s += " FAILED"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

func (fc *fleetCmd) pauseCmd() *cobra.Command {
	var (
		f          controlFlags
		mode       string
		clearCache bool
	)
	cmd := &cobra.Command{
		Use:   "pause",
		Short: "Pause scheduling on the fleet (recorded in the desired state, so servers that missed it pause when they converge)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := pauseMode(mode)
			if err != nil {
				return err
			}
			return fc.control(cmd, "pause", f, func(ctx context.Context, c *sdk.Client, o sdk.Call) ([]sdk.ServerResult, error) {
				return c.Pause(ctx, sdk.PauseOptions{Call: o, Mode: m, ClearCache: clearCache})
			})
		},
	}
	cmd.Flags().StringVar(&mode, "mode", string(sdk.PauseAbort), "what happens to requests in flight: abort, wait (let them finish) or keep (freeze them)")
	cmd.Flags().BoolVar(&clearCache, "clear-cache", false, "also reset the prefix cache and the offloaded KV after pausing")
	f.register(cmd)
	return cmd
}

func pauseMode(s string) (sdk.PauseMode, error) {
	switch s {
	case protocol.ModeAbort, protocol.ModeWait, protocol.ModeKeep:
		return sdk.PauseMode(s), nil
	}
	return "", fmt.Errorf("--mode %q: want abort, wait or keep", s)
}

func (fc *fleetCmd) resumeCmd() *cobra.Command {
	var f controlFlags
	cmd := &cobra.Command{
		Use:   "resume",
		Short: "Let the fleet schedule again (and clear a fleet pause from the desired state)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fc.control(cmd, "resume", f, func(ctx context.Context, c *sdk.Client, o sdk.Call) ([]sdk.ServerResult, error) {
				return c.Resume(ctx, sdk.ResumeOptions{Call: o})
			})
		},
	}
	f.register(cmd)
	return cmd
}

func (fc *fleetCmd) sleepCmd() *cobra.Command {
	var (
		f     controlFlags
		level int
		mode  string
	)
	cmd := &cobra.Command{
		Use:   "sleep",
		Short: "Pause the fleet and release memory: level 1 the KV cache, 2 also the weights",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := pauseMode(mode)
			if err != nil {
				return err
			}
			if level < 0 || level > 2 {
				return fmt.Errorf("--level %d: want 0, 1 or 2", level)
			}
			return fc.control(cmd, "sleep", f, func(ctx context.Context, c *sdk.Client, o sdk.Call) ([]sdk.ServerResult, error) {
				// --level 0 is the SDK's PauseOnly: its Level 0 is the default level.
				return c.Sleep(ctx, sdk.SleepOptions{Call: o, Level: level, PauseOnly: level == 0, Mode: m})
			})
		},
	}
	cmd.Flags().IntVar(&level, "level", 1, "1: release the KV cache; 2: also the weights; 0: only pause")
	cmd.Flags().StringVar(&mode, "mode", string(sdk.PauseAbort), "pause mode for servers not paused already: abort, wait or keep")
	f.register(cmd)
	return cmd
}

func (fc *fleetCmd) wakeCmd() *cobra.Command {
	var (
		f    controlFlags
		tags []string
	)
	cmd := &cobra.Command{
		Use:   "wake",
		Short: "Restore what sleep released (--tags weights,kv_cache; default everything)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, t := range tags {
				if t != protocol.TagWeights && t != protocol.TagKVCache {
					return fmt.Errorf("--tags %q: want weights and/or kv_cache", t)
				}
			}
			return fc.control(cmd, "wake", f, func(ctx context.Context, c *sdk.Client, o sdk.Call) ([]sdk.ServerResult, error) {
				return c.WakeUp(ctx, sdk.WakeOptions{Call: o, Tags: tags})
			})
		},
	}
	cmd.Flags().StringSliceVar(&tags, "tags", nil, "what to restore: weights, kv_cache (default: everything)")
	f.register(cmd)
	return cmd
}

func (fc *fleetCmd) resetCmd() *cobra.Command {
	var (
		f                       controlFlags
		resetExternal, resetRun bool
	)
	cmd := &cobra.Command{
		Use:   "reset",
		Short: "Reset the fleet's prefix cache (--reset-external: also the offloaded KV); a server fails unless everything was cleared",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fc.control(cmd, "reset", f, func(ctx context.Context, c *sdk.Client, o sdk.Call) ([]sdk.ServerResult, error) {
				return c.ResetCache(ctx, sdk.ResetOptions{Call: o, ResetExternal: resetExternal, ResetRunning: resetRun})
			})
		},
	}
	cmd.Flags().BoolVar(&resetExternal, "reset-external", false, "also reset the offloaded (CPU) KV")
	cmd.Flags().BoolVar(&resetRun, "reset-running", false, "preempt running requests so that no block stays in use")
	f.register(cmd)
	return cmd
}

// updateView is what `fleet update --json` prints: the SDK's UpdateResult as UpdateWeights
// returned it, with the fleet's name and the command's error (an incomplete update too).
type updateView struct {
	sdk.UpdateResult
	Fleet string `json:"fleet"`
	Error string `json:"error,omitempty"`
}

func (fc *fleetCmd) updateCmd() *cobra.Command {
	var (
		ref        sdk.WeightsRef
		policy     string
		mode       string
		sleepLevel int
		clearCache bool
		timeout    time.Duration
		targets    []string
	)
	cmd := &cobra.Command{
		Use:   "update",
		Short: "Move the fleet to new weights as one transaction: stage while serving, then pause, sleep, swap, wake, resume",
		Long: "Every target fetches and verifies --source (checked against --sha256, which\n" +
			"`rollout weights digest` prints) while it keeps serving; then, by --policy, the servers\n" +
			"that staged commit: all (any failure aborts, nobody swaps), quorum:K (commit when K\n" +
			"staged; the others are stale until they catch up by themselves) or rolling:K (K servers\n" +
			"at a time while the rest keep generating). Exits 1 unless every target committed.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("version") {
				return fmt.Errorf("--version is required")
			}
			if ref.URI == "" {
				return fmt.Errorf("--source is required")
			}
			if err := ref.Validate(); err != nil {
				return fmt.Errorf("fleet update: %w", err)
			}
			pol, err := sdk.ParsePolicy(policy)
			if err != nil {
				return fmt.Errorf("--policy: %w", err)
			}
			m, err := pauseMode(mode)
			if err != nil {
				return err
			}
			if sleepLevel < 0 || sleepLevel > 2 {
				return fmt.Errorf("--sleep-level %d: want 0, 1 or 2", sleepLevel)
			}
			if timeout <= 0 {
				return fmt.Errorf("--timeout %s: want a duration > 0", timeout)
			}
			// --sleep-level 0 is the plan's NoSleep: its SleepLevel 0 is the default level.
			plan := sdk.Plan{Policy: pol, Mode: m, KeepCache: !clearCache, SleepLevel: sleepLevel, NoSleep: sleepLevel == 0,
				StageTimeout: timeout, CommitTimeout: timeout, Targets: targets}
			return fc.withClient(cmd, func(ctx context.Context, c *sdk.Client) error {
				res, err := c.UpdateWeights(ctx, ref, plan)
				if res == nil {
					return fmt.Errorf("fleet update: %w", err)
				}
				if err == nil {
					err = incomplete(res)
				}
				out := cmd.OutOrStdout()
				if fc.asJSON {
					if jerr := fc.writeJSON(out, updateView{UpdateResult: *res, Fleet: c.Fleet(), Error: errorText(err)}); jerr != nil {
						return jerr
					}
				} else if perr := printUpdate(out, c.Fleet(), res); perr != nil {
					return perr
				}
				if err != nil {
					return fmt.Errorf("fleet update: %w", err)
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.Int64Var(&ref.Version, "version", 0, "the new weight version (above the fleet's current one)")
	f.StringVar(&ref.URI, "source", "", "where servers fetch it: a path or file:// URI on the servers, or an http(s) URL (rollout weights serve)")
	f.StringVar(&ref.SHA256, "sha256", "", "its digest, as rollout weights digest prints it (servers refuse other bytes)")
	f.StringVar(&policy, "policy", "all", "all, quorum:K or rolling:K")
	f.StringVar(&mode, "mode", string(sdk.PauseAbort), "pause mode of the cut: abort (samples continue on the new weights), wait or keep")
	f.IntVar(&sleepLevel, "sleep-level", 1, "sleep level of the cut: 1 releases the KV cache, 2 also the weights, 0 skips sleeping")
	f.BoolVar(&clearCache, "clear-cache", true, "reset the prefix cache and offloaded KV at the pause (stale KV must not meet new weights)")
	f.DurationVar(&timeout, "timeout", time.Minute, "bound on staging and on each commit command")
	f.StringSliceVar(&targets, "targets", nil, "server ids to update (default: every live server)")
	return cmd
}

// errIncomplete is the exit-1 reason of an update whose policy was met while some target did
// not commit (a quorum update that left servers stale).
var errIncomplete = errors.New("not every target committed")

func incomplete(r *sdk.UpdateResult) error {
	var failed []string
	for _, s := range r.Servers {
		if !s.Committed {
			failed = append(failed, s.ServerID)
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %w: %s stale", r.Outcome, errIncomplete, strings.Join(failed, ", "))
}

// printUpdate prints one row per server with a column per phase (in the order the servers
// reported them), then a summary line.
// phaseMark says how a phase of s ended when it did not succeed: FAILED when the server
// said so, or "not waited for" when the policy was decided before the server's stage ack
// came (the server did not fail; its ack was no longer needed).
func phaseMark(s sdk.ServerUpdate, p sdk.PhaseResult) string {
	switch {
	case p.OK:
		return ""
	case p.Name == "stage" && s.Stage != nil && s.Stage.Ack == nil && errors.Is(s.Stage.Err, sdk.ErrAborted):
		return " (not waited for)"
	case p.Name == "stage" && s.Stage != nil && s.Stage.Ack == nil:
		return " NO ACK"
	default:
		return " FAILED"
	}
}

func printUpdate(out io.Writer, fleet string, r *sdk.UpdateResult) error {
	var phases []string
	for _, s := range r.Servers {
		for _, p := range s.Phases {
			if !slices.Contains(phases, p.Name) {
				phases = append(phases, p.Name)
			}
		}
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	head := "SERVER\tSTAGED\tCOMMITTED\tVERSION"
	for _, p := range phases {
		head += "\t" + strings.ToUpper(p) + " ms"
	}
	fmt.Fprintln(tw, head+"\tBUBBLE ms\tERROR")
	for _, s := range r.Servers {
		ver := "-" // no ack read from the server: its version is not known here
		if acked(s) {
			ver = fmt.Sprint(s.WeightVersion)
		}
		row := fmt.Sprintf("%s\t%v\t%v\t%s", s.ServerID, s.Staged, s.Committed, ver)
		for _, name := range phases {
			cell := "-"
			for _, p := range s.Phases {
				if p.Name == name {
					cell = fmt.Sprintf("%.1f", p.Seconds*1e3) + phaseMark(s, p)
				}
			}
			row += "\t" + cell
		}
		bubble := "-"
		if s.Committed {
			bubble = fmt.Sprintf("%.1f", ms(s.Bubble))
			if !s.BubbleMeasured {
				bubble += " (commit time)"
			}
		}
		msg := ""
		if s.Err != nil {
			msg = s.Err.Error()
		}
		if s.Stale {
			msg = strings.TrimSpace("stale " + msg)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", row, bubble, oneLine(msg))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "fleet %s: version %d, policy %s: %s", fleet, r.Version, r.Policy, r.Outcome)
	if r.Reason != "" {
		fmt.Fprintf(out, " (%s)", r.Reason)
	}
	fmt.Fprintf(out, "; stage %.1f ms, commit %.1f ms, total %.1f ms, max bubble %.1f ms\n",
		ms(r.StageTime), ms(r.CommitTime), ms(r.Duration), ms(r.MaxBubble))
	return nil
}

// acked reports whether the update read an ack of the server's (stage or commit).
func acked(s sdk.ServerUpdate) bool {
	return (s.Stage != nil && s.Stage.Ack != nil) || (s.Commit != nil && s.Commit.Ack != nil)
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

func optInt(v int64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprint(v)
}

// oneLine keeps a table row on one line whatever a server put in its error.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
