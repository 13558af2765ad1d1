package archtest

import (
	"fmt"
	"slices"
	"strings"
)

// listedPackage is the part of `go list -json` output the checker reads.
type listedPackage struct {
	ImportPath string
	Imports    []string // direct imports
	Deps       []string // transitive imports, sorted
	Module     *struct{ Path string }
	Error      *struct{ Err string }
}

// rule says: packages matching From (minus Except) must not depend, directly or
// transitively, on anything matching Forbid; and when AllowModule is non-nil, their direct
// imports from the module must all match it.
type rule struct {
	Name        string
	Why         string
	From        []string
	Except      []string
	Forbid      []string
	AllowModule []string
}

// applies reports whether the rule governs the package at path.
func (r rule) applies(path string) bool {
	return matchAny(r.From, path) && !matchAny(r.Except, path)
}

// violation is one broken rule, with the import chain that breaks it.
type violation struct {
	Rule  string
	Why   string
	Pkg   string
	Dep   string
	Chain []string // Pkg ... Dep along direct imports; nil when unknown
	More  int      // further forbidden deps under the same pattern, not listed
}

func (v violation) String() string {
	chain := v.Dep
	if len(v.Chain) > 0 {
		short := make([]string, len(v.Chain))
		for i, p := range v.Chain {
			short[i] = trimModule(p)
		}
		chain = strings.Join(short, " -> ")
	}
	more := ""
	if v.More > 0 {
		more = fmt.Sprintf(" (and %d more under the same pattern)", v.More)
	}
	return fmt.Sprintf("[%s] %s must not import %s: %s%s — %s", v.Rule, trimModule(v.Pkg), trimModule(v.Dep), chain, more, v.Why)
}

func trimModule(p string) string {
	if rest, ok := strings.CutPrefix(p, modulePath+"/"); ok {
		return rest
	}
	return p
}

// match reports whether path matches pattern: exact, or "base/..." for base and below.
func match(pattern, path string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

func matchAny(patterns []string, path string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return match(p, path) })
}

func inModule(path string) bool { return match(modulePath+"/...", path) }

// check applies rules to the module's packages in pkgs (which may also hold their
// dependencies, as `go list -deps` prints them) and returns every violation.
func check(pkgs []listedPackage, rules []rule) []violation {
	byPath := make(map[string]*listedPackage, len(pkgs))
	for i := range pkgs {
		byPath[pkgs[i].ImportPath] = &pkgs[i]
	}
	var out []violation
	for _, p := range pkgs {
		if !inModule(p.ImportPath) {
			continue
		}
		dist, chainTo := importPaths(byPath, p.ImportPath)
		for _, r := range rules {
			if !r.applies(p.ImportPath) {
				continue
			}
			for _, pattern := range r.Forbid {
				var hits []string
				for _, d := range p.Deps {
					if match(pattern, d) {
						hits = append(hits, d)
					}
				}
				if len(hits) == 0 {
					continue
				}
				// Name the forbidden package nearest to p, which is the one its imports bring in.
				dep := slices.MinFunc(hits, func(a, b string) int {
					if d := dist(a) - dist(b); d != 0 {
						return d
					}
					return len(a) - len(b)
				})
				chain := chainTo(dep)
				if len(chain) > 2 && r.applies(chain[1]) {
					// The next package on the chain is under the same rule and is reported
					// itself; repeating it for every importer only buries the cause.
					continue
				}
				out = append(out, violation{
					Rule: r.Name, Why: r.Why, Pkg: p.ImportPath, Dep: dep, Chain: chain, More: len(hits) - 1,
				})
			}
			if r.AllowModule != nil {
				for _, imp := range p.Imports {
					if inModule(imp) && !matchAny(r.AllowModule, imp) {
						out = append(out, violation{
							Rule: r.Name, Why: r.Why, Pkg: p.ImportPath, Dep: imp,
							Chain: []string{p.ImportPath, imp},
						})
					}
				}
			}
		}
	}
	return out
}

// importPaths runs a breadth-first search along direct imports from 'from'. dist gives the
// number of import hops to a package (a large number when unreachable) and chainTo the
// shortest chain from 'from' to it, so a violation names the package that brings the
// forbidden one in.
func importPaths(byPath map[string]*listedPackage, from string) (dist func(string) int, chainTo func(string) []string) {
	prev := map[string]string{from: ""}
	hops := map[string]int{from: 0}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		p, ok := byPath[cur]
		if !ok {
			continue
		}
		for _, imp := range p.Imports {
			if _, seen := prev[imp]; !seen {
				prev[imp] = cur
				hops[imp] = hops[cur] + 1
				queue = append(queue, imp)
			}
		}
	}
	dist = func(to string) int {
		if h, ok := hops[to]; ok {
			return h
		}
		return len(byPath) + 1
	}
	chainTo = func(to string) []string {
		if _, ok := prev[to]; !ok {
			return nil
		}
		var chain []string
		for p := to; p != ""; p = prev[p] {
			chain = append(chain, p)
		}
		slices.Reverse(chain)
		return chain
	}
	return dist, chainTo
}
