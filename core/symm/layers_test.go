package symm

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The files of this package stand in layers (docs/design.md, "Inside
// core/symm"): a file uses names (types, functions, methods, fields,
// variables, constants) defined in files below it, never above. The one
// exception is descriptor_path.go, low enough for the Group to hold its
// paths, whose interface names the two calls it serves (exchangeCall,
// resumeCall). The layers are at most maxFloors high.

const maxFloors = 8

// backArrows are the arrows allowed to run back up: from a file to the
// files whose names it may use from below.
var backArrows = map[string][]string{
	"descriptor_path.go": {"rendezvous.go", "pause.go"},
}

// fileArrows maps each non-test file of the package in dir to the files
// whose names it uses, with the names.
func fileArrows(t *testing.T, dir string) map[string]map[string][]string {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var files []*ast.File
	for _, e := range entries {
		n := e.Name()
		if !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, 0)
		require.NoError(t, err)
		files = append(files, f)
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	pkg, err := conf.Check("symm", fset, files, info)
	require.NoError(t, err)
	arrows := map[string]map[string][]string{}
	for id, obj := range info.Uses {
		if obj.Pkg() != pkg || !obj.Pos().IsValid() {
			continue
		}
		// Package-level names, methods and fields; not a function's locals.
		if obj.Parent() != nil && obj.Parent() != pkg.Scope() {
			continue
		}
		from := filepath.Base(fset.Position(id.Pos()).Filename)
		to := filepath.Base(fset.Position(obj.Pos()).Filename)
		if from == to {
			continue
		}
		if arrows[from] == nil {
			arrows[from] = map[string][]string{}
		}
		if !slices.Contains(arrows[from][to], obj.Name()) {
			arrows[from][to] = append(arrows[from][to], obj.Name())
		}
	}
	return arrows
}

func TestFilesStandInLayers(t *testing.T) {
	if _, err := os.Stat(filepath.Join(runtime.GOROOT(), "src", "fmt")); err != nil {
		t.Skip("reads the sources with Go's type checker, which needs Go's own sources (a test binary carried to a machine without Go has none)")
	}
	arrows := fileArrows(t, ".")
	require.Contains(t, arrows, "create.go") // the walk saw the package
	for from, tos := range backArrows {
		for _, to := range tos {
			require.Contains(t, arrows[from], to, "an allowed back arrow that the code does not have: drop it from backArrows")
			delete(arrows[from], to)
		}
	}
	// floor: 1 + the highest floor of what a file uses; a file met again
	// while its floor is being found closes a circle.
	floor := map[string]int{}
	var path []string
	var visit func(f string) (int, error)
	visit = func(f string) (int, error) {
		if i := slices.Index(path, f); i >= 0 {
			circle := append(slices.Clone(path[i:]), f)
			var steps []string
			for k := 0; k+1 < len(circle); k++ {
				names := arrows[circle[k]][circle[k+1]]
				slices.Sort(names)
				steps = append(steps, fmt.Sprintf("%s -> %s (%s)", circle[k], circle[k+1], strings.Join(names, " ")))
			}
			return 0, fmt.Errorf("files that use each other's names in a circle: %s", strings.Join(steps, ", "))
		}
		if n, ok := floor[f]; ok {
			return n, nil
		}
		path = append(path, f)
		n := 1
		for to := range arrows[f] {
			m, err := visit(to)
			if err != nil {
				return 0, err
			}
			n = max(n, m+1)
		}
		path = path[:len(path)-1]
		floor[f] = n
		return n, nil
	}
	top := 0
	for f := range arrows {
		n, err := visit(f)
		require.NoError(t, err)
		top = max(top, n)
	}
	require.LessOrEqual(t, top, maxFloors, "floors: %v", floor)
}
