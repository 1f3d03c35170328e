package core_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const module = "github.com/libsymmem/libsymmem/"

// arrows says, for each package of the house (a folder relative to the
// repository root), which of the module's packages its non-test files may
// import: the arrows of docs/design.md. "C" stands for cgo. Everything else
// is what the room never touches.
var arrows = map[string][]string{
	// The vocabulary: results, settings, quoting, timeouts, the Backend and
	// Communicator interfaces. It knows nothing above it.
	"core":           {"core/unmanaged"},
	"core/unmanaged": {},
	// The lock order (Note [Lock order]): the ranked locks of the allocator
	// and of the groups. It imports nothing of the module.
	"core/lockrank": {},
	// The allocator and the backends and the channel: each knows the
	// vocabulary only, never each other.
	"core/alloc": {"core", "core/lockrank", "core/unmanaged"},
	"core/host":  {"core", "core/unmanaged"},
	"core/ipc":   {"core", "core/unmanaged"},
	// Groups sit on the allocator and the channel; backends and engines
	// (cuda) only through core's interfaces.
	"core/symm": {"core", "core/alloc", "core/ipc", "core/lockrank", "core/unmanaged"},
	// The collectives know a handle only through its description in core
	// (core.SymmetricBuffer) and the Port they define (core/symm's Handle
	// implements it), the pads' layout and the engines through core:
	// neither they nor core/symm import the other.
	"core/symm/coll": {"core", "core/lockrank", "core/unmanaged"},
	// The CUDA backend and the NCCL engine implement core's interfaces.
	"cuda":   {"C", "core", "core/unmanaged", "include"},
	"export": {"C", "core", "core/alloc", "core/host", "core/ipc", "core/symm", "core/symm/coll", "core/unmanaged", "cuda"},
	// Helpers of tests and benchmarks.
	"core/internal/faultbe":  {"core"},
	"core/internal/ranktest": {"core"},
	"cuda/internal/nccltest": {"C"},
	"bench/gofloor":          {"C", "core/unmanaged"},
	"include":                {},
}

// importsOf maps each package folder to the imports of its non-test files
// (module packages relative to the root, "C" for cgo), each with a file
// that makes it.
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

// wrongArrows lists the imports of pkg that its arrows do not allow.
func wrongArrows(pkg string, imports map[string]string) []string {
	allowed, ok := arrows[pkg]
	if !ok {
		return []string{"(a package with no room in the house: give it its arrows here and in docs/design.md)"}
	}
	var out []string
	for im, file := range imports {
		if !slices.Contains(allowed, im) {
			out = append(out, pkg+"/"+file+" imports "+im)
		}
	}
	slices.Sort(out)
	return out
}

func TestLayersImportDownwardsOnly(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	pkgs := importsOf(t, root)
	// The walk sees the house.
	require.Contains(t, pkgs, "core/symm")
	require.Contains(t, pkgs["core/symm"], "core/alloc")
	require.Contains(t, pkgs["export"], "C")
	require.Contains(t, pkgs["export"], "core/symm/coll")
	for pkg, imports := range pkgs {
		for _, bad := range wrongArrows(pkg, imports) {
			t.Errorf("%s: %s, against the arrows of docs/design.md", pkg, bad)
		}
	}
}

func TestArrowsCatchAWrongArrow(t *testing.T) {
	assert.NotEmpty(t, wrongArrows("core/symm", map[string]string{"cuda": "x.go"}))
	assert.NotEmpty(t, wrongArrows("core/symm", map[string]string{"C": "x.go"}))
	assert.NotEmpty(t, wrongArrows("core", map[string]string{"core/alloc": "x.go"}))
	assert.NotEmpty(t, wrongArrows("core/alloc", map[string]string{"core/symm": "x.go"}))
	assert.NotEmpty(t, wrongArrows("cuda", map[string]string{"core/symm": "x.go"}))
	assert.NotEmpty(t, wrongArrows("core/symm", map[string]string{"core/symm/coll": "x.go"}))
	assert.NotEmpty(t, wrongArrows("core/symm/coll", map[string]string{"core/symm": "x.go"}))
	assert.NotEmpty(t, wrongArrows("core/newroom", nil), "a new package needs its arrows")
	assert.Empty(t, wrongArrows("export", map[string]string{"cuda": "x.go", "core/symm": "y.go"}))
	// Nothing imports the entry points or the benchmarks.
	for pkg := range arrows {
		assert.NotContains(t, arrows[pkg], "export", pkg)
		assert.NotContains(t, arrows[pkg], "bench/gofloor", pkg)
	}
}
