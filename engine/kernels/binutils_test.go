package kernels

import (
	"bufio"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// scanAsm calls fn for each line of the assembly files matching glob that re matches, with
// the line's place ("file:line") and re's submatches.
func scanAsm(t *testing.T, glob string, re *regexp.Regexp, fn func(where string, m []string)) {
	t.Helper()
	files, err := filepath.Glob(glob)
	require.NoError(t, err)
	for _, f := range files {
		fh, err := os.Open(f)
		require.NoError(t, err)
		sc := bufio.NewScanner(fh)
		for line := 1; sc.Scan(); line++ {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				fn(fmt.Sprintf("%s:%d", f, line), m)
			}
		}
		require.NoError(t, sc.Err())
		require.NoError(t, fh.Close())
	}
}

// assembleText assembles src with binutils' assembler as (and its flags args) and returns the
// object's .text bytes.
func assembleText(t *testing.T, as, src string, args ...string) []byte {
	t.Helper()
	dir := t.TempDir()
	in, obj := filepath.Join(dir, "src.s"), filepath.Join(dir, "src.o")
	require.NoError(t, os.WriteFile(in, []byte(src), 0o644))
	out, err := exec.Command(as, append(args, "-o", obj, in)...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	ef, err := elf.Open(obj)
	require.NoError(t, err)
	defer ef.Close()
	text, err := ef.Section(".text").Data()
	require.NoError(t, err)
	return text
}
