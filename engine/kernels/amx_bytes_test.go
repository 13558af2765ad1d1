package kernels

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// x86Bytes is a line of BYTE directives of the amd64 assembly with the instruction (GNU Intel
// syntax) its comment names.
var x86Bytes = regexp.MustCompile(`^\s*BYTE \$0x[0-9a-f]{2}(?:; BYTE \$0x[0-9a-f]{2})* // (.+)$`)

// TestAMXByteEncodings assembles the instruction beside every line of BYTEs of the amd64
// assembly (the AMX instructions the Go assembler lacks, written out by gen_amx.go) with
// binutils' x86-64 assembler and requires the same bytes, so no line is another instruction
// than its comment says. It runs on any CPU, AMX or not: most machines cannot run the tile
// that TestW8A8MatMulMatchesDefinition tests. It is skipped without an x86-64 `as`.
func TestAMXByteEncodings(t *testing.T) {
	name := "x86_64-linux-gnu-as"
	if runtime.GOARCH == "amd64" && runtime.GOOS == "linux" {
		name = "as"
	}
	as, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not installed (binutils)", name)
	}
	files, err := filepath.Glob("*_amd64.s")
	require.NoError(t, err)
	src := strings.Builder{}
	src.WriteString(".intel_syntax noprefix\n")
	var want [][]byte
	var where []string
	for _, f := range files {
		fh, err := os.Open(f)
		require.NoError(t, err)
		sc := bufio.NewScanner(fh)
		for line := 1; sc.Scan(); line++ {
			m := x86Bytes.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			var enc []byte
			for _, field := range strings.Split(strings.SplitN(sc.Text(), "//", 2)[0], ";") {
				v, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(field), "BYTE $0x"), 16, 8)
				require.NoError(t, err, "%s:%d", f, line)
				enc = append(enc, byte(v))
			}
			want = append(want, enc)
			where = append(where, fmt.Sprintf("%s:%d: %s", f, line, m[1]))
			src.WriteString(m[1] + "\n")
		}
		require.NoError(t, sc.Err())
		require.NoError(t, fh.Close())
	}
	require.NotEmpty(t, want, "the amd64 assembly has BYTE-encoded instructions")

	dir := t.TempDir()
	in, obj := filepath.Join(dir, "bytes.s"), filepath.Join(dir, "bytes.o")
	require.NoError(t, os.WriteFile(in, []byte(src.String()), 0o644))
	out, err := exec.Command(as, "--64", "-o", obj, in).CombinedOutput()
	require.NoError(t, err, "%s", out)
	ef, err := elf.Open(obj)
	require.NoError(t, err)
	defer ef.Close()
	text, err := ef.Section(".text").Data()
	require.NoError(t, err)
	off := 0
	for i, w := range want {
		require.LessOrEqual(t, off+len(w), len(text), "%s: binutils' encoding is shorter", where[i])
		require.True(t, bytes.Equal(w, text[off:off+len(w)]), "%s: % x, binutils % x", where[i], w, text[off:off+len(w)])
		off += len(w)
	}
	require.Equal(t, len(text), off, "binutils' encodings are longer")
	t.Logf("%d BYTE-encoded instructions match binutils", len(want))
}
