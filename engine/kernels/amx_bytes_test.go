package kernels

import (
	"bytes"
	"os/exec"
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
	src := strings.Builder{}
	src.WriteString(".intel_syntax noprefix\n")
	var want [][]byte
	var where []string
	scanAsm(t, "*_amd64.s", x86Bytes, func(at string, m []string) {
		var enc []byte
		for _, field := range strings.Split(strings.SplitN(m[0], "//", 2)[0], ";") {
			v, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(field), "BYTE $0x"), 16, 8)
			require.NoError(t, err, "%s", at)
			enc = append(enc, byte(v))
		}
		want = append(want, enc)
		where = append(where, at+": "+m[1])
		src.WriteString(m[1] + "\n")
	})
	require.NotEmpty(t, want, "the amd64 assembly has BYTE-encoded instructions")

	text := assembleText(t, as, src.String(), "--64")
	off := 0
	for i, w := range want {
		require.LessOrEqual(t, off+len(w), len(text), "%s: binutils' encoding is shorter", where[i])
		require.True(t, bytes.Equal(w, text[off:off+len(w)]), "%s: % x, binutils % x", where[i], w, text[off:off+len(w)])
		off += len(w)
	}
	require.Equal(t, len(text), off, "binutils' encodings are longer")
	t.Logf("%d BYTE-encoded instructions match binutils", len(want))
}
