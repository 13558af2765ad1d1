package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/weightstore"
)

func newWeightsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "weights", Short: "Serve versioned checkpoints and compute the digests weight updates verify"}
	cmd.AddCommand(newWeightsServeCmd(), newWeightsDigestCmd())
	return cmd
}

// digestResult is what `weights digest --json` prints.
type digestResult struct {
	Path   string `json:"path"`
	Format string `json:"format"`
	SHA256 string `json:"sha256"`
}

func newWeightsDigestCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "digest PATH",
		Short: "Print the SHA-256 digest /update_weights and UpdateWeights verify, for --sha256",
		Long: "Print the digest of a checkpoint exactly as a weight update verifies it, so scripts can\n" +
			"pass it as --sha256. PATH is a Hugging Face checkpoint directory (the digest covers\n" +
			"config.json and the safetensors files: `cd DIR && sha256sum config.json model.safetensors | sha256sum`)\n" +
			"or a llama2.c .bin file (the file's SHA-256).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := args[0]
			st, err := os.Stat(path)
			if err != nil {
				return fmt.Errorf("weights digest: %w", err)
			}
			format := weights.FormatLlama2C
			if st.IsDir() {
				format = weights.FormatHF
			}
			sum, err := weights.Digest(cmd.Context(), path)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(digestResult{Path: path, Format: format, SHA256: sum})
			}
			_, err = fmt.Fprintln(out, sum)
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {path, format, sha256} as JSON")
	return cmd
}

// weightsServeMux is the store's handler plus /metrics, whose
// rollout_weights_served_bytes_total is the egress a fleet's peer distribution keeps at about
// one checkpoint per update.
func weightsServeMux(store *weightstore.Store) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rollout_weights_served_bytes_total",
		Help: "Checkpoint file bytes this weight server sent (its egress)."}, func() float64 { return float64(store.BytesServed()) }))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", store.Handler())
	return mux
}

func newWeightsServeCmd() *cobra.Command {
	var addr string
	cmd := &cobra.Command{
		Use:   "serve DIR",
		Short: "Serve the versioned checkpoints in DIR/vN/ over HTTP, with their digests, for weight updates to fetch",
		Long: "Serve DIR, a weight store: version N is the Hugging Face checkpoint in DIR/vN/. GET /\n" +
			"(or /index.json) lists every version with its SHA-256 (rescanning DIR, so versions a\n" +
			"trainer publishes meanwhile appear), /vN/ is one version's entry, and /vN/<file> its files;\n" +
			"/metrics counts the checkpoint bytes served (rollout_weights_served_bytes_total: the trainer's egress).\n" +
			"A weight update's source is then http://ADDR/vN/ with the listed sha256. Runs until SIGINT\n" +
			"or SIGTERM.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if st, err := os.Stat(args[0]); err != nil || !st.IsDir() {
				return fmt.Errorf("weights serve: %s is not a directory", args[0])
			}
			store, err := weightstore.Open(ctx, args[0])
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("weights serve: %w", err)
			}
			base := "http://" + ln.Addr().String()
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "serving weight store %s at %s/\n", store.Dir(), base)
			for _, e := range store.Versions() {
				fmt.Fprintf(out, "  version %d: --source %s%s --sha256 %s\n", e.Version, base, e.Path, e.SHA256)
			}
			srv := &http.Server{Handler: weightsServeMux(store), ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ln) }()
			select {
			case err := <-done:
				return fmt.Errorf("weights serve: %w", err)
			case <-ctx.Done():
			}
			// Let downloads in flight finish for a moment; a rollout server retries the rest.
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err = srv.Shutdown(sctx)
			if serr := <-done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
				err = serr
			}
			return err
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8100", "listen address")
	return cmd
}
