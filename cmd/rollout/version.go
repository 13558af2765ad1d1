package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/rolloutkit/rollout/engine/kernels"
)

// versionInfo is what `rollout version` reports. The JSON names are part of the CLI's output
// contract for scripts.
type versionInfo struct {
	Version      string `json:"version"`
	Commit       string `json:"commit"`
	Modified     bool   `json:"modified,omitempty"`
	GoVersion    string `json:"go_version"`
	Platform     string `json:"platform"`
	GOEXPERIMENT string `json:"goexperiment"`
	// SIMD says whether the simd/archsimd experiment is compiled in: "off" without
	// GOEXPERIMENT=simd (the default: the kernels are assembly and need no experiment),
	// otherwise the CPU features archsimd detects.
	SIMD string `json:"simd"`
	// Kernel is the MatMul kernel this process runs on this CPU ("avx512", "avx2", "generic",
	// see kernels.KernelName) and KernelBuild the kernel family built in ("assembly",
	// "archsimd, GOEXPERIMENT=simd", "portable, purego", see kernels.KernelBuild).
	Kernel      string `json:"kernel"`
	KernelBuild string `json:"kernel_build"`
}

// currentVersion combines the link-time variables with the build info the go command embeds.
func currentVersion() versionInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return newVersionInfo(version, commit, bi)
}

// newVersionInfo prefers the -ldflags values and falls back to the module version and VCS
// stamp from bi (nil when the binary carries no build info).
func newVersionInfo(ldVersion, ldCommit string, bi *debug.BuildInfo) versionInfo {
	v := versionInfo{
		Version:   ldVersion,
		Commit:    ldCommit,
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
		SIMD:      simdState(),

		Kernel:      kernels.KernelName(),
		KernelBuild: kernels.KernelBuild(),
	}
	if bi != nil {
		if v.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if v.Commit == "" {
					v.Commit = s.Value
				}
			case "vcs.modified":
				v.Modified = s.Value == "true"
			case "GOEXPERIMENT":
				v.GOEXPERIMENT = s.Value
			}
		}
	}
	if v.Version == "" {
		v.Version = "devel"
	}
	if v.Commit == "" {
		v.Commit = "unknown"
	}
	if v.GOEXPERIMENT == "" && simdExperiment {
		// Tests run without build settings; the build tag still knows.
		v.GOEXPERIMENT = "simd"
	}
	if v.GOEXPERIMENT == "" {
		v.GOEXPERIMENT = "none"
	}
	return v
}

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print version, commit, Go version, SIMD build state and the kernels in use",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return writeVersion(cmd.OutOrStdout(), currentVersion(), asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func writeVersion(w io.Writer, v versionInfo, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	modified := ""
	if v.Modified {
		modified = " (modified)"
	}
	_, err := fmt.Fprintf(w, "rollout %s\ncommit:       %s%s\ngo:           %s %s\ngoexperiment: %s\nsimd:         %s\nkernels:      %s (%s)\n",
		v.Version, v.Commit, modified, v.GoVersion, v.Platform, v.GOEXPERIMENT, v.SIMD, v.Kernel, v.KernelBuild)
	return err
}
