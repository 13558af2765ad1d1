package archtest

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocReferencesResolve: every Markdown document named in the repository's code, docs and
// build files is a file of the repository, and nothing cites a section ("§n") or a path outside
// it, so a reader of the repository alone can follow every reference.
func TestDocReferencesResolve(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	// The sibling directory this project's planning notes live in is built from parts, so this
	// test does not itself trip the check it makes.
	outside := ".." + "/" + "shared"
	mdRef := regexp.MustCompile(`[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md\b`)
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" || d.Name() == "bin" || d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		if !(strings.HasSuffix(name, ".go") || strings.HasSuffix(name, ".md") || strings.HasSuffix(name, ".yml") ||
			name == "Makefile" || name == "Dockerfile") || name == "docrefs_test.go" {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		text := string(data)
		checked++
		for i, line := range strings.Split(text, "\n") {
			if strings.Contains(line, "§") || strings.Contains(line, outside) {
				t.Errorf("%s:%d cites a section or a path outside the repository: %s", rel, i+1, strings.TrimSpace(line))
			}
			for _, ref := range mdRef.FindAllString(line, -1) {
				if !resolves(root, filepath.Dir(path), ref) {
					t.Errorf("%s:%d names %s, which the repository does not have", rel, i+1, ref)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked only %d files: the walk is broken", checked)
	}
}

func resolves(root, dir, ref string) bool {
	ref = strings.TrimPrefix(ref, "./")
	for _, base := range []string{dir, root, filepath.Join(root, "docs")} {
		if _, err := os.Stat(filepath.Join(base, filepath.FromSlash(ref))); err == nil {
			return true
		}
	}
	return false
}
