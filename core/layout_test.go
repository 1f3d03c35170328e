package core_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const module = "github.com/libsymmem/libsymmem/"

// forbidden says, for a package (a folder relative to the repository root),
// which of the module's packages it must not import: the arrows of the
// house in docs/design.md, written as what each room never touches. "C"
// stands for cgo.
func forbidden(pkg string) []string {
	var out []string
	if pkg == "core" || strings.HasPrefix(pkg, "core/") {
		// core is pure Go and knows backends and engines through interfaces.
		out = append(out, "C", "cuda", "export", "bench", "include")
	}
	switch pkg {
	case "core":
		out = append(out, "core/symm", "core/ipc", "core/host")
	case "core/ipc", "core/host":
		out = append(out, "core/symm")
	case "cuda":
		out = append(out, "core/symm", "core/ipc", "core/host", "export", "bench")
	}
	// Nothing imports the library's entry points or the benchmarks.
	return append(out, "export", "bench/gofloor")
}

// importsOf maps each package folder to the imports of its non-test files
// (module packages relative to the root, "C" for cgo).
func importsOf(t *testing.T, root string) map[string]map[string]string {
	pkgs := map[string]map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && path != root && (name == "build" || name == "testdata" || strings.HasPrefix(name, ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		rel = filepath.ToSlash(rel)
		if pkgs[rel] == nil {
			pkgs[rel] = map[string]string{}
		}
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			switch {
			case p == "C":
				pkgs[rel]["C"] = name
			case strings.HasPrefix(p, module):
				pkgs[rel][strings.TrimPrefix(p, module)] = name
			}
		}
		return nil
	})
	require.NoError(t, err)
	return pkgs
}

func TestLayersImportDownwardsOnly(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	pkgs := importsOf(t, root)
	// The walk sees the house.
	require.Contains(t, pkgs, "core/symm")
	require.Contains(t, pkgs["core/symm"], "core/ipc")
	require.Contains(t, pkgs["export"], "C")
	for pkg, imports := range pkgs {
		for _, bad := range forbidden(pkg) {
			if file, ok := imports[bad]; ok {
				t.Errorf("%s/%s imports %s, against the arrows of docs/design.md", pkg, file, bad)
			}
		}
	}
}

func TestForbiddenCatchesAWrongArrow(t *testing.T) {
	assert.Contains(t, forbidden("core/symm"), "cuda")
	assert.Contains(t, forbidden("core/symm"), "C")
	assert.Contains(t, forbidden("cuda"), "core/symm")
	assert.NotContains(t, forbidden("export"), "cuda")
}
