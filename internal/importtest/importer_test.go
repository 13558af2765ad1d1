package importtest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// goSumCeiling is the most go.sum lines a module importing sdk and server/embedded may have.
//
// What fills that go.sum: `go mod tidy` records a checksum for every module that provides a
// package those two import (directly or not) or that a test of such a package imports (so that
// `go test all` works in the importer), plus the go.mod checksums of the module graph it had to
// read. The second part includes the test dependencies of third-party packages (go-redis's
// ginkgo and gomega, promhttp's klauspost/compress, quic-go's mock, ...), which no change here
// can remove. Measured at 169 when this test was written (76 modules with code, 93 go.mod-only
// lines); with every _test.go file of this repository deleted it is 155, the floor. The ceiling
// leaves a few lines for a new indirect dependency of a dependency; a jump past it means
// something heavy (a dev tool, a new test-only library) reached the packages importers use.
const goSumCeiling = 175

// importerSource imports the two packages a program embedding rollout uses.
const importerSource = `package main

import (
	_ "github.com/rolloutkit/rollout/sdk"
	_ "github.com/rolloutkit/rollout/server/embedded"
)

func main() {}
`

// TestImporterGoSum builds the throwaway importer and checks its go.sum length.
//
// It runs offline when the module cache has what the repository's own go.sum lists: the
// importer starts from a copy of the repository's go.sum (tidy drops what it does not need), so
// no checksum-database lookup is needed, and GOPROXY is inherited for a cache that lacks a
// module. GOFLAGS=-mod=mod lets tidy and build update go.mod; GOWORK=off keeps an enclosing
// go.work out; GOTOOLCHAIN=local keeps the go command from fetching another toolchain.
func TestImporterGoSum(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("skipping: the importer test runs the go command and `go` is not on PATH")
	}
	if testing.Short() {
		t.Skip("skipping in -short mode: building an importer of sdk and server/embedded takes minutes on a cold build cache")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module example.com/importer\n\ngo 1.26.0\n\n" +
		"require github.com/rolloutkit/rollout v0.0.0\n\n" +
		"replace github.com/rolloutkit/rollout => " + root + "\n"
	write(t, filepath.Join(dir, "go.mod"), gomod)
	write(t, filepath.Join(dir, "main.go"), importerSource)
	seed, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "go.sum"), string(seed))

	env := append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOTOOLCHAIN=local")
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(gobin, args...)
		cmd.Dir = dir
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("go %s in the importer module: %v\n%s", strings.Join(args, " "), err, out.String())
		}
	}
	run("mod", "tidy")
	run("build", "-o", os.DevNull, ".")

	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	lines, code, modules := countSum(string(sum))
	t.Logf("importer go.sum: %d lines (ceiling %d), %d modules with code:\n  %s",
		lines, goSumCeiling, len(code), strings.Join(code, "\n  "))
	if lines > goSumCeiling {
		t.Errorf("a module importing sdk and server/embedded has %d go.sum lines, more than the ceiling %d: "+
			"something heavy now reaches those packages or their tests (run `go mod why -m <module>` in an importer). "+
			"Modules in its go.sum:\n  %s", lines, goSumCeiling, strings.Join(modules, "\n  "))
	}
}

// countSum returns the number of go.sum lines, the modules whose code (not only go.mod) is
// summed, and every module path@version named, both sorted.
func countSum(sum string) (lines int, code, modules []string) {
	seenCode, seenAll := map[string]bool{}, map[string]bool{}
	for _, l := range strings.Split(sum, "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			continue
		}
		lines++
		version, goModOnly := strings.CutSuffix(f[1], "/go.mod")
		mv := f[0] + "@" + version
		seenAll[mv] = true
		if !goModOnly {
			seenCode[mv] = true
		}
	}
	for mv := range seenCode {
		code = append(code, mv)
	}
	for mv := range seenAll {
		modules = append(modules, mv)
	}
	sort.Strings(code)
	sort.Strings(modules)
	return lines, code, modules
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
