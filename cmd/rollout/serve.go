package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/attribute"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/load"
	"github.com/rolloutkit/rollout/sdk/telemetry"
	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/api"
)

func newServeCmd() *cobra.Command {
	var (
		cfg                   server.Config
		kvBytes, offloadBytes sizeValue
		memBytes              sizeValue
		maxBody               sizeValue
		secretFile, keyFile   string
		adminTokenFile        string
		apiKeyFile            string
		stateDir              string
		noTokenFile           bool
		maxBodyInflight       sizeValue
		minRate               sizeValue
		insecureAdmin         bool
		allowedHosts          []string
		redis                 redisFlags
		precision             string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the engine over HTTP: OpenAI-compatible and native RL routes, admin plane, metrics",
		Long: "Serve one engine (and its KV offloading connector) over HTTP until SIGINT or SIGTERM, then\n" +
			"shut down gracefully: stop intake, let in-flight requests finish within --shutdown-grace,\n" +
			"abort the rest, exit 0. With no flags it serves builtin:tiny on 127.0.0.1:8000.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.KVBytes = int64(kvBytes)
			cfg.MemoryBytes = int64(memBytes)
			cfg.OffloadCPUBytes = int64(offloadBytes)
			cfg.MaxBodyBytes = int64(maxBody)
			cfg.MaxBodyBytesInFlight = int64(maxBodyInflight)
			cfg.WeightsMinRate = int64(minRate)
			if cfg.WeightsMinRate == 0 {
				cfg.WeightsMinRate = -1 // --weights-min-rate 0: no minimum
			}
			cfg.Version = currentVersion().Version
			cfg.Logger = loggerFrom(cmd)
			cfg.Redis = redis.config(cmd)
			if os.Getenv(gin.EnvGinMode) == "" {
				// gin's debug mode prints every route at startup; the server logs through slog.
				gin.SetMode(gin.ReleaseMode)
			}
			if cfg.KVBlocks > 0 && cfg.KVBytes > 0 {
				return fmt.Errorf("--kv-blocks and --kv-bytes are exclusive")
			}
			if cfg.MemoryBytes > 0 && (cfg.KVBlocks > 0 || cfg.KVBytes > 0) {
				return fmt.Errorf("--memory sizes the KV pool as --kv-blocks and --kv-bytes do: give one of them")
			}
			var err error
			if cfg.Precision, err = kernels.ParsePrecision(precision); err != nil {
				return fmt.Errorf("--precision: %w", err)
			}
			for _, sf := range []struct {
				flag, file string
				dst        *string
			}{{"fleet-secret", secretFile, &cfg.FleetSecret}, {"admin-token", adminTokenFile, &cfg.AdminToken}, {"api-key", apiKeyFile, &cfg.APIKey}} {
				if sf.file == "" {
					continue
				}
				if *sf.dst != "" {
					return fmt.Errorf("--%s and --%s-file are exclusive", sf.flag, sf.flag)
				}
				v, err := readSecretFile(sf.file)
				if err != nil {
					return fmt.Errorf("--%s-file: %w", sf.flag, err)
				}
				*sf.dst = v
			}
			if keyFile != "" {
				b, err := os.ReadFile(keyFile)
				if err != nil {
					return fmt.Errorf("--fleet-key-file: %w", err)
				}
				cfg.FleetKey = b
			}
			// An explicit --state-dir also keeps the fleet's desired state there (one file per
			// directory: give each server on a host its own).
			cfg.StateDir = stateDir
			warnSecretFlags(cmd, cfg.Logger)
			// No tokenless admin over TCP: without a token the server generates one and
			// writes it where `rollout admin` (and scripts) find it: admin-token-PORT, the
			// port of the listener serving the admin routes.
			if cfg.AdminToken == "" && !noTokenFile && !strings.HasPrefix(cfg.AdminAddr, "unix:") {
				if stateDir == "" {
					stateDir = server.DefaultStateDir()
				}
				addr, ln := cfg.Addr, &cfg.Listener
				if cfg.AdminAddr != "" {
					addr, ln = cfg.AdminAddr, &cfg.AdminListener
				}
				port, err := listenerPort(addr, ln)
				if err != nil {
					return err
				}
				cfg.AdminTokenPath = server.AdminTokenFile(stateDir, port)
			}
			// File weight sources only under --weights-root ("/" allows any).
			cfg.NoFileWeights = cfg.WeightsRoot == ""
			var attrs []attribute.KeyValue
			if cfg.Fleet != "" {
				attrs = append(attrs, attribute.String("rollout.fleet", cfg.Fleet))
			}
			if cfg.ServerID != "" {
				attrs = append(attrs, attribute.String("rollout.server_id", cfg.ServerID))
			}
			tp, shutdown, err := telemetry.Setup(cmd.Context(), telemetry.Options{Exporter: cfg.OTel, ServiceName: "rollout-serve",
				Attributes: attrs, Stdout: cmd.OutOrStdout()})
			if err != nil {
				return fmt.Errorf("--otel %s: %w", cfg.OTel, err)
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := shutdown(ctx); err != nil {
					cfg.Logger.Warn("flushing traces", "err", err)
				}
			}()
			cfg.TracerProvider = tp
			return server.Run(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Model, "model", load.DefaultSpec, "model: builtin:NAME[@SEED], an HF checkpoint directory, or a llama2.c .bin file (or its directory)")
	f.StringVar(&cfg.Tokenizer, "tokenizer", "", "tokenizer file overriding the one beside the checkpoint")
	f.StringVar(&cfg.Addr, "addr", server.DefaultAddr, "listen address")
	f.IntVar(&cfg.KVBlocks, "kv-blocks", 0, "KV pool size in blocks (0: derived)")
	f.Var(&kvBytes, "kv-bytes", "KV pool size in bytes, e.g. 256MiB (0: derived)")
	f.Var(&memBytes, "memory", "memory for the packed model and the KV pool together, e.g. 8GiB: the pool gets what the model at --precision leaves (instead of --kv-blocks or --kv-bytes)")
	f.BoolVar(&cfg.PrefaultKV, "kv-prefault", true, "commit the KV pool's memory at start, so no decode step pays a first-touch page fault (costs start-up time in proportion to the pool)")
	f.StringVar(&precision, "precision", "f32", "weight precision in memory: f32, bf16 (half the bytes; rounded once at load and update) int8 (blocks of 32 with a float32 scale, 1.125 bytes a weight) or w8a8 (int8's weights, and each MatMul's input quantized per block too, for integer dot products: faster at batch 1, not the float32 MatMul of any weights)")
	f.IntVar(&cfg.BlockSize, "block-size", engine.DefaultBlockSize, "KV block size in tokens")
	f.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", engine.DefaultMaxNumSeqs, "maximum running sequences")
	f.IntVar(&cfg.MaxBatchedTokens, "max-batched-tokens", engine.DefaultMaxBatchedTokens, "maximum tokens per engine step")
	f.Var(&offloadBytes, "offload-cpu-bytes", "CPU memory for KV offloading, e.g. 1GiB (0: off)")
	f.DurationVar(&cfg.OffloadDelay, "offload-delay", 0, "extra delay per offload transfer (tests and benchmarks only)")
	// A test knob (black-box reset tests hold transfers in flight with it): it works, and
	// docs/cli.md documents it, but --help does not offer it.
	_ = f.MarkHidden("offload-delay")
	redis.register(f, "Redis of the fleet control plane")
	f.StringVar(&cfg.Fleet, "fleet", "", "fleet name to join")
	f.StringVar(&cfg.ServerID, "server-id", "", "this server's id in the fleet (default: hostname-port)")
	f.StringVar(&cfg.AdvertiseURL, "advertise-url", "", "URL the fleet routes requests to (default: from --addr)")
	f.StringVar(&cfg.FleetSecret, "fleet-secret", "", "HMAC secret of the fleet's control commands (at least 32 bytes)")
	f.StringVar(&secretFile, "fleet-secret-file", "", "file holding the fleet secret (trailing newline ignored), so it stays out of ps")
	f.StringVar(&keyFile, "fleet-key-file", "", "this server's issued key (rollout fleet keys issue): verifies the trainer's commands, signs only this server's messages; instead of --fleet-secret-file")
	f.BoolVar(&cfg.InsecureUnsignedFleet, "insecure-unsigned-fleet", false, "join a fleet without a secret: the server then obeys anyone who can publish on its Redis (refused without this flag)")
	f.StringVar(&cfg.AdminToken, "admin-token", "", "bearer token of the admin routes (unset: one is generated and written to --state-dir); prefer --admin-token-file, flags show in ps")
	f.StringVar(&adminTokenFile, "admin-token-file", "", "file holding the admin token (trailing newline ignored), so it stays out of ps")
	f.StringVar(&stateDir, "state-dir", "", "directory of the generated admin token file admin-token-PORT (default: $XDG_RUNTIME_DIR/rollout, else $XDG_STATE_HOME/rollout, else ~/.local/state/rollout); when given, a fleet server also keeps the newest desired state it accepted there, so it knows the fleet's version and run state after a restart even if Redis lost it")
	f.BoolVar(&noTokenFile, "no-admin-token-file", false, "do not write the generated admin token anywhere (the admin routes are then usable only through a unix --admin-addr)")
	f.BoolVar(&cfg.FleetAdminRoutes, "fleet-admin-routes", false, "on a fleet member, keep the admin routes that change weights and run state (/pause, /resume, /sleep, /wake_up, /update_weights); off by default since the fleet is their authority")
	f.StringVar(&cfg.APIKey, "api-key", "", "bearer token of the generation routes (unset: open); prefer --api-key-file, flags show in ps")
	f.StringVar(&apiKeyFile, "api-key-file", "", "file holding the API key (trailing newline ignored), so it stays out of ps")
	f.StringVar(&cfg.AdminAddr, "admin-addr", "", "serve the admin routes on their own listener: ADDR or unix:PATH (unset: on --addr)")
	// Tokenless admin over TCP is gone: these two no longer change anything.
	f.BoolVar(&insecureAdmin, "insecure-admin", false, "no effect: admin routes over TCP always need a token")
	f.StringSliceVar(&allowedHosts, "allowed-hosts", nil, "no effect: admin routes over TCP always need a token")
	_ = f.MarkDeprecated("insecure-admin", "admin routes over TCP always need a token now (generated when none is given)")
	_ = f.MarkDeprecated("allowed-hosts", "admin routes over TCP always need a token now (generated when none is given)")
	f.StringVar(&cfg.WeightsRoot, "weights-root", "", "directory file:// and path weight sources must lie in, symlinks out of it refused (unset: file sources are refused; / allows any)")
	f.DurationVar(&cfg.WeightsFetchTimeout, "weights-fetch-timeout", 0, "deadline of a whole weight fetch and load (0: 10m)")
	minRate = 1 << 20
	f.Var(&minRate, "weights-min-rate", "least bytes/s a weight download must average over every --weights-min-rate-window (default 1MiB; 0: no minimum)")
	f.DurationVar(&cfg.WeightsMinRateWindow, "weights-min-rate-window", 0, "window of --weights-min-rate (0: 30s)")
	f.BoolVar(&cfg.AllowUnverifiedWeights, "allow-unverified-weights", false, "accept http(s) weight sources without a sha256")
	f.BoolVar(&cfg.NoSpareWeights, "no-spare-weights", false, "do not prepare a spare weight set (and its packed copy) at start-up for the first update (saves about twice the checkpoint's float32 size until the second update)")
	f.BoolVar(&cfg.WeightsAllowPrivate, "weights-allow-private", false,
		"let http(s) weight fetches reach loopback, private and link-local addresses (loopback is allowed when --addr is loopback)")
	f.StringVar(&cfg.PeerDir, "peer-dir", "", "directory of the versions this fleet server serves its peers at /weights/ (default: a temporary one)")
	f.BoolVar(&cfg.NoPeers, "no-peers", false, "no /weights/ peer route: fetch weight updates from the origin only and feed no peer")
	f.StringVar(&cfg.OTel, "otel", "", "trace exporter: none, stdout or otlp (default: OTEL_TRACES_EXPORTER, else none; OTLP reads the standard OTEL_EXPORTER_OTLP_* variables)")
	f.IntVar(&cfg.MaxConcurrent, "max-concurrent", api.DefaultMaxConcurrent, "generation requests served at once")
	f.IntVar(&cfg.MaxQueue, "max-queue", api.DefaultMaxQueue, "generation requests waiting for a slot before 429")
	maxBody = api.DefaultMaxBodyBytes
	f.Var(&maxBody, "max-body-bytes", "largest request body (413 beyond)")
	maxBodyInflight = api.DefaultMaxBodyBytesInFlight
	f.Var(&maxBodyInflight, "max-body-bytes-inflight", "memory budget of request bodies in flight, admitted before they are read (503 with Retry-After beyond)")

	f.DurationVar(&cfg.ShutdownGrace, "shutdown-grace", server.DefaultShutdownGrace, "time in-flight requests get to finish on shutdown")
	f.Int64Var(&cfg.WeightVersion, "weight-version", 0, "version number of the initial weights")
	return cmd
}

// listenerPort is the port of addr; for port 0 it listens first (into *ln, which the server
// then uses), so the port is known before the token file is named.
func listenerPort(addr string, ln *net.Listener) (string, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("listen address %s: %w", addr, err)
	}
	if port != "0" {
		return port, nil
	}
	if *ln, err = net.Listen("tcp", addr); err != nil {
		return "", fmt.Errorf("listen %s: %w", addr, err)
	}
	_, port, _ = net.SplitHostPort((*ln).Addr().String())
	return port, nil
}

// warnSecretFlags warns about every secret given as a flag value on the command line: any
// local user sees it in ps (or /proc/PID/cmdline). A value from the environment is not
// warned about.
func warnSecretFlags(cmd *cobra.Command, log *slog.Logger) {
	for _, name := range []string{"fleet-secret", "admin-token", "api-key"} {
		f := cmd.Flags().Lookup(name)
		if f == nil || !f.Changed || f.Value.String() == "" || os.Getenv(envName(name)) == f.Value.String() {
			continue
		}
		log.Warn("--"+name+" on the command line is visible to every local user (ps, /proc/PID/cmdline): use --"+name+"-file FILE, or the environment variable "+envName(name),
			"flag", "--"+name, "use", "--"+name+"-file")
	}
}

// readSecretFile reads a secret from a file, without the trailing newline editors add.
func readSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

// sizeValue is a byte count flag: a plain number or one with a unit (K, M, G, T: powers of
// 1024, also written KiB…; KB, MB, GB, TB: powers of 1000).
type sizeValue int64

func (s *sizeValue) String() string { return strconv.FormatInt(int64(*s), 10) }

func (s *sizeValue) Type() string { return "size" }

func (s *sizeValue) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*s = sizeValue(n)
	return nil
}

func parseSize(v string) (int64, error) {
	t := strings.TrimSpace(v)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mult := map[string]float64{"": 1, "b": 1,
		"k": 1 << 10, "kib": 1 << 10, "kb": 1e3, "m": 1 << 20, "mib": 1 << 20, "mb": 1e6,
		"g": 1 << 30, "gib": 1 << 30, "gb": 1e9, "t": 1 << 40, "tib": 1 << 40, "tb": 1e12}[unit]
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || mult == 0 || f < 0 {
		return 0, fmt.Errorf("size %q: want a byte count such as 1048576, 512MiB or 2GB", v)
	}
	return int64(f * mult), nil
}
