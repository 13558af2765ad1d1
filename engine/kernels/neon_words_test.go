package kernels

import (
	"encoding/binary"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// neonWord is a WORD directive of the arm64 assembly with the instruction its comment names.
var neonWord = regexp.MustCompile(`^\s*WORD \$0x([0-9a-f]{8}) // (.+)$`)

// TestNEONWordEncodings assembles the instruction beside every WORD of the arm64 assembly
// (the vector instructions the Go assembler lacks, encoded by hand or by gen_neon.go) with
// binutils' aarch64 assembler and requires the same encoding, so no word is another
// instruction than its comment says. It runs on any host; it is skipped where
// aarch64-linux-gnu-as (Debian: binutils-aarch64-linux-gnu) is not installed.
func TestNEONWordEncodings(t *testing.T) {
	as, err := exec.LookPath("aarch64-linux-gnu-as")
	if err != nil {
		t.Skip("aarch64-linux-gnu-as not installed (binutils-aarch64-linux-gnu)")
	}
	var src strings.Builder
	var want []uint32
	var where []string
	scanAsm(t, "*_arm64.s", neonWord, func(at string, m []string) {
		w, err := strconv.ParseUint(m[1], 16, 32)
		require.NoError(t, err)
		want = append(want, uint32(w))
		where = append(where, at+": "+m[2])
		src.WriteString(m[2] + "\n")
	})
	require.NotEmpty(t, want, "the arm64 assembly has WORD-encoded instructions")

	text := assembleText(t, as, src.String(), "-march=armv8.2-a+dotprod")
	require.Len(t, text, 4*len(want), "one instruction per WORD")
	for i, w := range want {
		got := binary.LittleEndian.Uint32(text[4*i:])
		require.Equal(t, fmt.Sprintf("%08x", got), fmt.Sprintf("%08x", w), "%s", where[i])
	}
	t.Logf("%d WORD encodings match binutils", len(want))
}
