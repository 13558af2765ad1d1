package main

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMain points the state directory (where `serve` writes its generated admin token and
// `admin` finds it) at a temporary directory of this run.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rollout-cmd-state-")
	if err != nil {
		panic(err)
	}
	_ = os.Setenv("XDG_RUNTIME_DIR", dir)
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func TestRunUnknownCommandIsOneLine(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(t.Context(), []string{"vresion"}, &out, &errb)
	assert.Equal(t, 1, code)
	assert.Empty(t, out.String(), "no usage dump on stdout")
	msg := errb.String()
	require.True(t, strings.HasSuffix(msg, "\n"), msg)
	assert.Equal(t, 1, strings.Count(msg, "\n"), "exactly one line: %q", msg)
	assert.Contains(t, msg, `rollout: unknown command "vresion" for "rollout"`)
	assert.Contains(t, msg, `(did you mean "version"?)`)
}

func TestRunErrorsAreOneLine(t *testing.T) {
	for _, args := range [][]string{
		{"version", "--no-such-flag"},
		{"version", "stray"},
		{"--log-level", "loud", "version"},
	} {
		var out, errb bytes.Buffer
		code := run(t.Context(), args, &out, &errb)
		assert.Equal(t, 1, code, args)
		assert.Equal(t, 1, strings.Count(errb.String(), "\n"), "%v: %q", args, errb.String())
		assert.True(t, strings.HasPrefix(errb.String(), "rollout: "), errb.String())
	}
}

func TestRunSuccess(t *testing.T) {
	var out, errb bytes.Buffer
	assert.Equal(t, 0, run(t.Context(), []string{"version"}, &out, &errb))
	assert.Contains(t, out.String(), "rollout ")
	assert.Empty(t, errb.String())

	out.Reset()
	assert.Equal(t, 0, run(t.Context(), nil, &out, &errb), "bare rollout prints help")
	assert.Contains(t, out.String(), "Usage:")
}

func TestErrorLine(t *testing.T) {
	tests := []struct{ in, want string }{
		{"plain", "plain"},
		{"unknown command \"x\" for \"rollout\"\n\nDid you mean this?\n\tfoo\n\tbar\n",
			`unknown command "x" for "rollout" (did you mean "foo" or "bar"?)`},
		{"first\nsecond\n\nthird", "first; second; third"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, errorLine(errors.New(tt.in)))
	}
}
