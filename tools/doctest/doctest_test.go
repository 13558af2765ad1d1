package doctest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// root is the repository's top directory.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	return dir
}

// documents are the Markdown files whose blocks the test classifies and runs, relative to
// the root.
func documents(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root(t), "docs", "*.md"))
	require.NoError(t, err)
	out := []string{"README.md", "CONTRIBUTING.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root(t), d)
		require.NoError(t, err)
		out = append(out, rel)
	}
	require.Contains(t, out, filepath.Join("docs", "cli.md"))
	require.Contains(t, out, filepath.Join("docs", "fleet.md"))
	return out
}

func blocks(t *testing.T, doc string) []Block {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(root(t), doc))
	require.NoError(t, err)
	bs, err := Parse(string(text))
	require.NoError(t, err, doc)
	return bs
}

// TestEveryBlockIsRunOrExplained: no document has a block the command test would silently
// pass over.
func TestEveryBlockIsRunOrExplained(t *testing.T) {
	run := 0
	for _, doc := range documents(t) {
		for _, b := range blocks(t, doc) {
			kind, err := b.Kind()
			if err != nil {
				t.Errorf("%s: %v", doc, err)
			}
			if kind == KindRun {
				run++
			}
		}
	}
	require.GreaterOrEqual(t, run, 3, "the README's Usage and Fleet blocks and docs/cli.md's run")
}

// freePorts maps each well-known port to a port nobody listens on now.
func freePorts(t *testing.T) map[int]int {
	t.Helper()
	out := map[int]int{}
	var lns []net.Listener
	for _, p := range Ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		lns = append(lns, ln)
		out[p] = ln.Addr().(*net.TCPAddr).Port
	}
	for _, ln := range lns {
		require.NoError(t, ln.Close())
	}
	return out
}

// prelude gives the commands a fresh checkout's top directory (see the package doc).
const prelude = `export HOME="$PWD/.home" XDG_RUNTIME_DIR="$PWD/.run" XDG_STATE_HOME="$PWD/.state" PATH="$PWD/bin:$PATH"
mkdir -p "$HOME" "$XDG_STATE_HOME" && mkdir -m 0700 "$XDG_RUNTIME_DIR"
make() {
  if [ "$*" = build ]; then echo "make build: bin/rollout is already built"; return 0; fi
  echo "doctest: 'make $*' cannot run in the doc test: annotate its block with <!-- doctest: skip REASON -->" >&2
  return 1
}
PS4='+ '
set -x
`

// errorShape is the HTTP API's JSON error, which curl prints with exit code 0.
var errorShape = regexp.MustCompile(`"error":\s*\{`)

// TestDocCommandsRun runs every runnable block of each document, in order, as the package
// doc describes.
func TestDocCommandsRun(t *testing.T) {
	for _, tool := range []string{"bash", "curl", "redis-server"} {
		_, err := exec.LookPath(tool)
		require.NoError(t, err, "the doc commands need %s", tool)
	}
	bin := filepath.Join(t.TempDir(), "rollout")
	build := exec.Command("go", "build", "-o", bin, "./cmd/rollout")
	build.Dir = root(t)
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build ./cmd/rollout: %s", out)

	for _, doc := range documents(t) {
		var script strings.Builder
		n := 0
		for _, b := range blocks(t, doc) {
			if kind, _ := b.Kind(); kind != KindRun {
				continue
			}
			n++
			fmt.Fprintf(&script, "\n: '### %s:%d'\n%s\n", doc, b.Line, b.Body)
		}
		if n == 0 {
			continue
		}
		t.Run(strings.ReplaceAll(doc, string(filepath.Separator), "_"), func(t *testing.T) {
			runDoc(t, bin, doc, script.String())
		})
	}
}

// runDoc runs one document's commands in a fresh directory and stops what they leave running.
func runDoc(t *testing.T, bin, doc, commands string) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	require.NoError(t, os.Symlink(bin, filepath.Join(dir, "bin", "rollout")))
	ports := freePorts(t)
	script := filepath.Join(dir, ".doctest.sh")
	require.NoError(t, os.WriteFile(script, []byte(prelude+Substitute(commands, ports)), 0o644))
	logPath := filepath.Join(dir, ".doctest.log")
	logf, err := os.Create(logPath)
	require.NoError(t, err)
	defer logf.Close()

	// A generous bound for a hung command; the documents' commands take seconds.
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", script)
	cmd.Dir = dir
	cmd.Stdin = nil
	// A file, not a pipe: background servers inherit it, and Wait must not wait for them.
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	require.NoError(t, cmd.Start())
	pgid := cmd.Process.Pid
	runErr := cmd.Wait()
	// What the blocks left running (servers, redis-server) is in the script's process group.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)

	logText, err := os.ReadFile(logPath)
	require.NoError(t, err)
	report := func(why string) {
		t.Helper()
		t.Fatalf("%s: %s\nport substitution: %s\n--- output (the last block started is the last '### file:line') ---\n%s",
			doc, why, describePorts(ports), tail(string(logText), 6000))
	}
	if runErr != nil {
		report(fmt.Sprintf("the commands failed: %v", runErr))
	}
	if loc := errorShape.FindStringIndex(string(logText)); loc != nil {
		report("a command's output holds the API's JSON error shape at byte " + fmt.Sprint(loc[0]))
	}
	if testing.Verbose() {
		t.Logf("%s: ran in %s; output:\n%s", doc, dir, logText)
	}
}

func describePorts(ports map[int]int) string {
	keys := make([]int, 0, len(ports))
	for k := range ports {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d→%d", k, ports[k]))
	}
	return strings.Join(parts, " ")
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
