package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Set at link time by the Makefile: -ldflags "-X main.version=... -X main.commit=...".
// When empty, version.go falls back to the module build info embedded by the go command.
var (
	version string
	commit  string
)

func main() {
	redis.SetLogger(redisLog{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the CLI with args and returns the process exit code. It is main without the
// process globals, so tests can drive the whole path including error printing.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := NewRootCmd()
	if args == nil {
		args = []string{} // nil would make cobra read os.Args
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "rollout: %s\n", errorLine(err))
		return 1
	}
	return 0
}

var suggestionRE = regexp.MustCompile(`\n\nDid you mean this\?\n((?:\t[^\n]+\n?)+)`)

// errorLine renders err as a single line. Cobra's unknown-command error carries its
// suggestions on extra lines; they are folded into a "(did you mean ...?)" suffix, and any
// other line breaks become "; " so scripts reading stderr see exactly one line per failure.
func errorLine(err error) string {
	msg := err.Error()
	suffix := ""
	if m := suggestionRE.FindStringSubmatchIndex(msg); m != nil {
		var names []string
		for _, s := range strings.Split(msg[m[2]:m[3]], "\n") {
			if s = strings.TrimSpace(s); s != "" {
				names = append(names, fmt.Sprintf("%q", s))
			}
		}
		suffix = " (did you mean " + strings.Join(names, " or ") + "?)"
		msg = msg[:m[0]] + msg[m[1]:]
	}
	var parts []string
	for _, p := range strings.Split(msg, "\n") {
		if p = strings.TrimSpace(p); p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "; ") + suffix
}

// redisLog sends go-redis's own log lines (pool dial failures while Redis is down, reconnects)
// to slog at debug level instead of straight to stderr: what matters reaches the user as the
// returned error, on one line.
type redisLog struct{}

func (redisLog) Printf(ctx context.Context, format string, v ...any) {
	slog.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}
