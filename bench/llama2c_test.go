package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeRun writes a shell script standing in for llama2.c's run: it checks that the checkpoint
// and tokenizer are in its working directory and the flags are run.c's, then prints body.
func fakeRun(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "run")
	script := "#!/bin/sh\nset -e\ntest -s model.bin\ntest -s tokenizer.bin\n" +
		`[ "$1" = model.bin ] && [ "$2" = -t ] && [ "$3" = 0 ] && [ "$4" = -n ] && [ "$5" = 16 ]` + "\n" +
		`[ "$OMP_NUM_THREADS" = 2 ]` + "\n" + body + "\n"
	require.NoError(t, os.WriteFile(p, []byte(script), 0o755))
	return p
}

func TestLlama2CRunParsesAchieved(t *testing.T) {
	l, err := NewLlama2C(fakeRun(t, `echo "Once upon" ; echo "achieved tok/s: 123.500000" >&2`), "stories15m")
	require.NoError(t, err)
	dir := l.dir
	v, err := l.Run(t.Context(), 16, 2)
	require.NoError(t, err)
	assert.InDelta(t, 123.5, v, 1e-9)
	l.Close()
	assert.NoDirExists(t, dir, "Close removes the checkpoint")
}

func TestLlama2CErrors(t *testing.T) {
	l, err := NewLlama2C(fakeRun(t, `echo "no timing" >&2`), "stories15m")
	require.NoError(t, err)
	defer l.Close()
	_, err = l.Run(t.Context(), 16, 2)
	require.ErrorIs(t, err, ErrLlama2COutput)

	_, err = l.Run(t.Context(), 17, 2) // the script's flag check fails: a non-zero exit
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrLlama2COutput)

	_, err = NewLlama2C(filepath.Join(t.TempDir(), "missing"), "stories15m")
	require.Error(t, err)
	_, err = NewLlama2C(fakeRun(t, ""), "tiny")
	require.ErrorContains(t, err, "byte-level")
}

func TestMedian(t *testing.T) {
	assert.Zero(t, Median(nil))
	assert.Equal(t, 2.0, Median([]float64{3, 1, 2}))
	assert.Equal(t, 2.5, Median([]float64{4, 1, 3, 2}))
	in := []float64{3, 1, 2}
	Median(in)
	assert.Equal(t, []float64{3, 1, 2}, in, "Median does not reorder its input")
}
