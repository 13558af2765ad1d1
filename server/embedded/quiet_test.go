package embedded_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/server/embedded"
)

const quietChildEnv = "ROLLOUT_EMBEDDED_QUIET_CHILD"

// quietChild starts a two-server embedded fleet in a process that made no choice about gin,
// generates through the SDK and stops: what an importer of the library does.
func quietChild() int {
	ctx := context.Background()
	f, err := embedded.Start(ctx, embedded.Options{Servers: 2, Model: "builtin:tiny"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start:", err)
		return 1
	}
	defer f.Close()
	c, err := sdk.Dial(ctx, f.DialOptions())
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		return 1
	}
	defer c.Close()
	if _, err := c.Generate(ctx, sdk.GenerateRequest{PromptTokenIDs: []int{1, 2}, N: 2, Sampling: sdk.SamplingParams{MaxTokens: 3}}); err != nil {
		fmt.Fprintln(os.Stderr, "generate:", err)
		return 1
	}
	return 0
}

// TestQuietLibrary (issue 27, item 6): importing the SDK and the embedded fleet prints
// nothing to stdout, not even gin's debug lines of a process left in gin's default mode
// (44 lines before); logs go through slog (stderr by default).
func TestQuietLibrary(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.CommandContext(t.Context(), exe, "-test.run=^$")
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, "GIN_MODE=") }), quietChildEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "child: %s", stderr.String())
	require.Empty(t, stdout.String(), "the library printed to stdout")
	require.Contains(t, stderr.String(), "server", "the servers log through slog's default handler")
}
