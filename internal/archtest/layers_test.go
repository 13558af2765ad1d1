package archtest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// layer is one row of the layer table in docs/architecture.md.
type layer struct {
	Name      string
	Patterns  []string // full import-path patterns
	MayImport []string // layer names
}

// Markers around the layer table in docs/architecture.md.
const (
	layersBegin = "<!-- layers:begin -->"
	layersEnd   = "<!-- layers:end -->"
)

// parseLayers reads the table between the layer markers of an architecture document.
// Errors name the line, so a malformed edit of the document fails here and not silently.
func parseLayers(doc string) ([]layer, error) {
	_, rest, ok := strings.Cut(doc, layersBegin)
	if !ok {
		return nil, fmt.Errorf("no %s marker", layersBegin)
	}
	table, _, ok := strings.Cut(rest, layersEnd)
	if !ok {
		return nil, fmt.Errorf("no %s marker", layersEnd)
	}
	var out []layer
	names := map[string]bool{}
	for i, line := range strings.Split(strings.TrimSpace(table), "\n") {
		if i < 2 { // the header and the |---| row
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cells) != 3 {
			return nil, fmt.Errorf("layer row %q: want 3 cells, got %d", line, len(cells))
		}
		l := layer{Name: strings.TrimSpace(cells[0])}
		if l.Name == "" || names[l.Name] {
			return nil, fmt.Errorf("layer row %q: empty or repeated name", line)
		}
		names[l.Name] = true
		for _, p := range strings.Split(cells[1], ",") {
			p = strings.Trim(strings.TrimSpace(p), "`")
			if p == "" {
				return nil, fmt.Errorf("layer %s: empty package pattern", l.Name)
			}
			l.Patterns = append(l.Patterns, m(p))
		}
		for _, n := range strings.Split(cells[2], ",") {
			if n = strings.TrimSpace(n); n != "" {
				l.MayImport = append(l.MayImport, n)
			}
		}
		out = append(out, l)
	}
	for _, l := range out {
		for _, n := range l.MayImport {
			if !names[n] {
				return nil, fmt.Errorf("layer %s may import %q, which is no layer", l.Name, n)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("the layer table is empty")
	}
	return out, nil
}

// layerOf is the layer whose longest matching pattern matches path; "" when none does.
// Two layers matching with patterns of one length is an error of the table.
func layerOf(layers []layer, path string) (string, error) {
	best, bestLen, tie := "", -1, false
	for _, l := range layers {
		for _, p := range l.Patterns {
			if !match(p, path) {
				continue
			}
			if n := len(strings.TrimSuffix(p, "/...")); n > bestLen {
				best, bestLen, tie = l.Name, n, false
			} else if n == bestLen && l.Name != best {
				tie = true
			}
		}
	}
	if tie {
		return "", fmt.Errorf("%s matches two layers equally", trimModule(path))
	}
	return best, nil
}

// checkLayers returns one message per module package in no layer and per direct module
// import its layer does not allow.
func checkLayers(pkgs []listedPackage, layers []layer) []string {
	allowed := map[string][]string{}
	for _, l := range layers {
		allowed[l.Name] = append([]string{l.Name}, l.MayImport...)
	}
	var out []string
	for _, p := range pkgs {
		if !inModule(p.ImportPath) {
			continue
		}
		from, err := layerOf(layers, p.ImportPath)
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		if from == "" {
			out = append(out, fmt.Sprintf("%s is in no layer of docs/architecture.md", trimModule(p.ImportPath)))
			continue
		}
		for _, imp := range p.Imports {
			if !inModule(imp) {
				continue
			}
			to, err := layerOf(layers, imp)
			if err != nil || to == "" {
				continue // reported as a package of its own
			}
			if !slices.Contains(allowed[from], to) {
				out = append(out, fmt.Sprintf("[layers] %s (layer %s) imports %s (layer %s), which %s may not",
					trimModule(p.ImportPath), from, trimModule(imp), to, from))
			}
		}
	}
	return out
}

func readLayers(t *testing.T) []layer {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "architecture.md"))
	require.NoError(t, err)
	layers, err := parseLayers(string(doc))
	require.NoError(t, err, "docs/architecture.md layer table")
	return layers
}

// TestLayers is the gate: every package of the module is in a layer of docs/architecture.md
// and imports only what its layer may.
func TestLayers(t *testing.T) {
	layers := readLayers(t)
	pkgs := goList(t, "")
	own := 0
	for _, p := range pkgs {
		if inModule(p.ImportPath) {
			own++
		}
	}
	require.Positive(t, own, "go list found no packages of %s", modulePath)
	for _, msg := range checkLayers(pkgs, layers) {
		t.Error(msg)
	}
}

// TestLayerCheckerReportsViolations: the checker fails on an unlisted package, a forbidden
// import and an ambiguous table, and passes the allowed shapes, on synthetic data.
func TestLayerCheckerReportsViolations(t *testing.T) {
	layers := readLayers(t)
	pkgs := []listedPackage{
		pkg("server/peer", "weightstore", "sdk/protocol"), // allowed
		pkg("server/peer2", "trainer"),                    // server must not import the trainer
		pkg("sdk/session", "sdk", "engine/model"),         // a new sdk/x is in sdk: no engine
		pkg("server/embedded", "sdk", "server"),           // the longer pattern wins: allowed
		pkg("server/agent", "sdk"),                        // but server itself may not use sdk
		pkg("weightstore", "engine/weights", "sdk/protocol"),
		pkg("tools/x", "engine"), // in no layer
		pkg("github.com/x/y", "engine"),
	}
	got := checkLayers(pkgs, layers)
	want := []string{
		"[layers] server/peer2 (layer server) imports trainer (layer trainer), which server may not",
		"[layers] sdk/session (layer sdk) imports engine/model (layer engine), which sdk may not",
		"[layers] server/agent (layer server) imports sdk (layer sdk), which server may not",
		"tools/x is in no layer of docs/architecture.md",
	}
	assert.ElementsMatch(t, want, got)

	_, err := layerOf([]layer{{Name: "a", Patterns: []string{m("x/...")}}, {Name: "b", Patterns: []string{m("x")}}}, m("x"))
	assert.Error(t, err, "two layers claiming one package with equal patterns")
}

func TestParseLayersRefusesMalformedTables(t *testing.T) {
	for name, doc := range map[string]string{
		"no markers":    "| layer | packages | may import |",
		"no end":        layersBegin + "\n| a | b | c |",
		"empty":         layersBegin + "\n| layer | packages | may import |\n|---|---|---|\n" + layersEnd,
		"two cells":     layersBegin + "\n| layer | packages | may import |\n|---|---|---|\n| a | `x` |\n" + layersEnd,
		"unknown layer": layersBegin + "\n| layer | packages | may import |\n|---|---|---|\n| a | `x` | b |\n" + layersEnd,
		"repeated":      layersBegin + "\n| layer | packages | may import |\n|---|---|---|\n| a | `x` | |\n| a | `y` | |\n" + layersEnd,
		"empty pattern": layersBegin + "\n| layer | packages | may import |\n|---|---|---|\n| a | `x`, | |\n" + layersEnd,
	} {
		_, err := parseLayers(doc)
		assert.Error(t, err, name)
	}
}
