package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goCommand finds the go binary: PATH first, then the usual install location.
func goCommand(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/local/go/bin/go"); err == nil {
		return "/usr/local/go/bin/go"
	}
	t.Fatal("go command not found on PATH or at /usr/local/go/bin/go")
	return ""
}

// goList runs `go list -e -deps -json ./...` at the module root with GOEXPERIMENT set as given.
func goList(t *testing.T, goexperiment string) []listedPackage {
	t.Helper()
	gobin := goCommand(t)
	env := append(os.Environ(), "GOEXPERIMENT="+goexperiment)

	gomod, err := exec.Command(gobin, "env", "GOMOD").Output()
	require.NoError(t, err, "go env GOMOD")
	root := filepath.Dir(strings.TrimSpace(string(gomod)))

	cmd := exec.Command(gobin, "list", "-e", "-deps",
		"-json=ImportPath,Imports,Deps,Module,Error", "./...")
	cmd.Dir = root
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderr.String())

	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			require.NoError(t, err, "decoding go list output")
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestDesignDependencyRules is the gate: the real module must satisfy designRules.
func TestDesignDependencyRules(t *testing.T) {
	for _, mode := range []struct{ name, goexperiment string }{
		{"default", ""},
		{"goexperiment_simd", "simd"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			pkgs := goList(t, mode.goexperiment)
			var own, engine int
			for _, p := range pkgs {
				if inModule(p.ImportPath) {
					own++
					if match(m("engine/..."), p.ImportPath) {
						engine++
					}
					if p.Error != nil {
						// Broken packages are the compiler's business; say so, don't hide it.
						t.Logf("note: %s: %s", p.ImportPath, p.Error.Err)
					}
				}
			}
			// Guard against a vacuous pass (wrong directory, empty listing).
			require.Positive(t, own, "go list found no packages of %s", modulePath)
			require.Positive(t, engine, "go list found no engine packages")
			for _, v := range check(pkgs, designRules()) {
				t.Error(v.String())
			}
		})
	}
}

// pkg builds synthetic go-list data. Paths whose first element has a dot are external,
// "std:" marks a standard-library path, and anything else is module-relative.
func pkg(path string, imports ...string) listedPackage {
	full := func(p string) string {
		if std, ok := strings.CutPrefix(p, "std:"); ok {
			return std
		}
		if strings.Contains(strings.Split(p, "/")[0], ".") {
			return p
		}
		return m(p)
	}
	p := listedPackage{ImportPath: full(path)}
	for _, i := range imports {
		p.Imports = append(p.Imports, full(i))
	}
	return p
}

// withDeps fills Deps as the transitive closure of Imports, as go list -deps does.
func withDeps(pkgs ...listedPackage) []listedPackage {
	byPath := map[string]listedPackage{}
	for _, p := range pkgs {
		byPath[p.ImportPath] = p
	}
	for i := range pkgs {
		seen := map[string]bool{}
		var visit func(string)
		visit = func(path string) {
			for _, imp := range byPath[path].Imports {
				if !seen[imp] {
					seen[imp] = true
					visit(imp)
				}
			}
		}
		visit(pkgs[i].ImportPath)
		for d := range seen {
			pkgs[i].Deps = append(pkgs[i].Deps, d)
		}
	}
	return pkgs
}

// TestCheckerReportsViolations shows the checker fails on each kind of broken rule, and
// stays quiet on the allowed shapes, using synthetic package data.
func TestCheckerReportsViolations(t *testing.T) {
	pkgs := withDeps(
		// engine/model -> engine/helper -> gin: reported once, where gin comes in.
		pkg("engine/model", "engine/helper", "go.opentelemetry.io/otel/trace"),
		pkg("engine/helper", "github.com/gin-gonic/gin"),
		pkg("github.com/gin-gonic/gin", "github.com/gin-gonic/gin/binding"),
		pkg("github.com/gin-gonic/gin/binding"),
		pkg("go.opentelemetry.io/otel/trace"),
		// engine importing offload: forbidden.
		pkg("engine/sample", "offload/cpu"),
		// offload: kvconnector is allowed, sched is not; nor is the engine core behind kvconnector.
		pkg("offload", "engine/kvconnector", "offload/cpu"),
		pkg("offload/cpu", "engine/sched"),
		pkg("engine/kvconnector", "engine"),
		pkg("engine/sched"),
		pkg("engine"),
		// sdk/protocol importing the engine: forbidden.
		pkg("sdk/protocol", "engine/kvconnector"),
		// trainer pulling in sdk/telemetry (and through it the OTel SDK): two rules.
		pkg("trainer", "sdk/telemetry"),
		pkg("sdk/telemetry", "go.opentelemetry.io/otel/sdk/trace"),
		pkg("go.opentelemetry.io/otel/sdk/trace"),
		// Allowed: mains may use telemetry; the server may build a provider; sdk may use redis.
		pkg("cmd/rollout", "sdk/telemetry", "github.com/spf13/cobra"),
		pkg("github.com/spf13/cobra"),
		pkg("server", "go.opentelemetry.io/otel/sdk/trace"),
		pkg("sdk/bus", "github.com/redis/go-redis/v9"),
		pkg("github.com/redis/go-redis/v9"),
	)
	got := map[string]bool{}
	for _, v := range check(pkgs, designRules()) {
		got[v.Rule+" "+trimModule(v.Pkg)+" "+trimModule(v.Dep)] = true
		if v.Pkg == m("offload") && v.Dep == m("engine") {
			assert.Equal(t, []string{m("offload"), m("engine/kvconnector"), m("engine")}, v.Chain)
			assert.Contains(t, v.String(), "offload -> engine/kvconnector -> engine")
		}
		if v.Pkg == m("engine/helper") && v.Dep == "github.com/gin-gonic/gin" {
			assert.Equal(t, 1, v.More, "gin/binding folded into the gin report")
		}
	}
	want := []string{
		"engine-isolation engine/helper github.com/gin-gonic/gin",
		"engine-isolation engine/sample offload/cpu",
		"offload-imports offload/cpu engine/sched", // outside the allowlist, and forbidden
		"offload-imports offload engine",           // through kvconnector
		"sdk-isolation sdk/protocol engine/kvconnector",
		"telemetry-in-mains trainer sdk/telemetry",
		"otel-sdk-at-edges trainer go.opentelemetry.io/otel/sdk/trace",
	}
	for _, w := range want {
		assert.True(t, got[w], "missing violation %q; got %v", w, got)
	}
	assert.Len(t, got, len(want), "unexpected extra violations: %v", got)
}

func TestPlainDataRule(t *testing.T) {
	rules := []rule{{Name: "plain-data", From: []string{m("engine/kvtypes")}, Forbid: []string{m("...")}}}
	ok := withDeps(pkg("engine/kvtypes", "std:fmt"), pkg("std:fmt"))
	assert.Empty(t, check(ok, rules))
	bad := withDeps(pkg("engine/kvtypes", "engine/kvcache"), pkg("engine/kvcache"))
	assert.Len(t, check(bad, rules), 1)
}

func TestMissingPackagesDoNotMatch(t *testing.T) {
	// A module with only an engine package: rules about offload, sdk, server... find nothing.
	assert.Empty(t, check(withDeps(pkg("engine/model", "std:math"), pkg("std:math")), designRules()))
	assert.Empty(t, check(nil, designRules()))
}

func TestMatch(t *testing.T) {
	tests := []struct {
		pattern, path string
		want          bool
	}{
		{"a/b/...", "a/b", true},
		{"a/b/...", "a/b/c/d", true},
		{"a/b/...", "a/bc", false},
		{"a/b", "a/b", true},
		{"a/b", "a/b/c", false},
		{"go.opentelemetry.io/otel/sdk/...", "go.opentelemetry.io/otel/sdk/trace", true},
		{"go.opentelemetry.io/otel/sdk/...", "go.opentelemetry.io/otel/trace", false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, match(tt.pattern, tt.path), "%s ~ %s", tt.pattern, tt.path)
	}
}
