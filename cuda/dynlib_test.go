package cuda

// Tests of the run-time loader (dynlib.go) on testdata/dynlibtest.c, built
// here in several copies.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libsymmem/libsymmem/core"
)

// buildTestLib compiles testdata/dynlibtest.c into path with soname and
// the extra flags.
func buildTestLib(t *testing.T, path, soname string, flags ...string) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler: %v", err)
	}
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	args := append([]string{"-shared", "-fPIC", "-o", path, "-Wl,-soname," + soname}, flags...)
	args = append(args, "testdata/dynlibtest.c")
	out, err := exec.Command(cc, args...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return path
}

// Each test uses its own sonames: a library once loaded stays loaded.
func TestOpenLibraryExplicitThenAlreadyLoaded(t *testing.T) {
	dir := t.TempDir()
	lib := buildTestLib(t, filepath.Join(dir, "a", "libsmtest_a.so"), "libsmtest_a.so.1")
	other := buildTestLib(t, filepath.Join(dir, "b", "libsmtest_a.so"), "libsmtest_a.so.1")
	spec := LibrarySpec{What: "the test library", Env: "SYMMEM_LIBSMTEST_A", Sonames: []string{"libsmtest_a.so.1"}}

	t.Setenv(spec.Env, filepath.Join(dir, "missing.so"))
	_, err := OpenLibrary(spec)
	require.Error(t, err)
	assert.Equal(t, core.ErrUnavailable, core.CodeOf(err))
	assert.Contains(t, err.Error(), "SYMMEM_LIBSMTEST_A="+core.Quote(filepath.Join(dir, "missing.so")))
	assert.Contains(t, err.Error(), ": cannot open shared object file", "the loader's reason, without the path again")

	t.Setenv(spec.Env, lib)
	l, err := OpenLibrary(spec)
	require.NoError(t, err)
	assert.Equal(t, lib, l.Path)
	assert.Equal(t, "$SYMMEM_LIBSMTEST_A", l.How)
	assert.NotNil(t, l.Sym("smtest_version"))
	assert.Nil(t, l.Sym("smtest_new"))

	// Loaded now: found by soname without the variable, as the same handle.
	t.Setenv(spec.Env, "")
	again, err := OpenLibrary(spec)
	require.NoError(t, err)
	assert.Equal(t, "already loaded", again.How)
	assert.Equal(t, l.handle, again.handle)
	assert.Equal(t, lib, again.Path, "the path comes from the dynamic linker")

	// The variable naming another copy while one is loaded is an error
	// that names both.
	t.Setenv(spec.Env, other)
	_, err = OpenLibrary(spec)
	require.Error(t, err)
	assert.Equal(t, core.ErrUnavailable, core.CodeOf(err))
	assert.Contains(t, err.Error(), core.Quote(other))
	assert.Contains(t, err.Error(), lib)
	assert.Contains(t, err.Error(), "already loaded")
}

func TestOpenLibraryWheelFolder(t *testing.T) {
	venv := t.TempDir()
	lib := buildTestLib(t, filepath.Join(venv, "lib", "python3.12", "site-packages", "nvidia", "smtestwheel", "lib", "libsmtest_w.so.2"), "libsmtest_w.so.2")
	spec := LibrarySpec{What: "the test library", Env: "SYMMEM_LIBSMTEST_W", Sonames: []string{"libsmtest_w.so.2"}, Wheel: "smtestwheel"}
	t.Setenv(spec.Env, "")
	t.Setenv("VIRTUAL_ENV", "")
	_, err := OpenLibrary(spec)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "site-packages/nvidia/smtestwheel/lib")
	assert.Contains(t, err.Error(), "set SYMMEM_LIBSMTEST_W")

	t.Setenv("VIRTUAL_ENV", venv)
	l, err := OpenLibrary(spec)
	require.NoError(t, err)
	assert.Equal(t, "wheel folder", l.How)
	assert.Equal(t, lib, l.Path)
}

// The wheel folder is found above the folders of loaded objects (torch's
// libraries live in site-packages/torch/lib).
func TestSearchDirsAboveLoadedObjects(t *testing.T) {
	sp := filepath.Join(t.TempDir(), "site-packages")
	wheel := filepath.Join(sp, "nvidia", "nccl", "lib")
	require.NoError(t, os.MkdirAll(wheel, 0o755))
	t.Setenv("VIRTUAL_ENV", "")
	t.Setenv("CONDA_PREFIX", "")
	t.Setenv("CUDA_HOME", "")
	t.Setenv("CUDA_PATH", "")
	spec := LibrarySpec{Sonames: []string{"libnccl.so.2"}, Wheel: "nccl", Toolkit: true}
	dirs := spec.searchDirs([]string{filepath.Join(sp, "torch", "lib", "libtorch_cuda.so"), filepath.Join(sp, "torch", "lib", "libc10.so")})
	require.NotEmpty(t, dirs)
	assert.Equal(t, candidate{wheel, "wheel folder"}, dirs[0])
	n := 0
	for _, d := range dirs {
		if d.path == wheel {
			n++
		}
	}
	assert.Equal(t, 1, n, "each folder once: %v", dirs)
}

func TestOpenLibraryToolkitFolder(t *testing.T) {
	home := t.TempDir()
	lib := buildTestLib(t, filepath.Join(home, "lib64", "libsmtest_t.so.3"), "libsmtest_t.so.3")
	spec := LibrarySpec{What: "the test library", Sonames: []string{"libsmtest_t.so.3"}, Toolkit: true}
	t.Setenv("CUDA_HOME", home)
	l, err := OpenLibrary(spec)
	require.NoError(t, err)
	assert.Equal(t, "toolkit folder", l.How)
	assert.Equal(t, lib, l.Path)
}

func TestResolveByVersion(t *testing.T) {
	dir := t.TempDir()
	old := buildTestLib(t, filepath.Join(dir, "libsmtest_old.so"), "libsmtest_old.so", "-DSMTEST_VERSION=22800")
	cur := buildTestLib(t, filepath.Join(dir, "libsmtest_new.so"), "libsmtest_new.so", "-DSMTEST_VERSION=22900", "-DSMTEST_WITH_NEW")
	ncclName := func(v int) string { return ncclVersionName(v) }
	open := func(path string) *Library {
		t.Setenv("SYMMEM_LIBSMTEST_R", path)
		l, err := OpenLibrary(LibrarySpec{What: "the test library", Env: "SYMMEM_LIBSMTEST_R", VersionName: ncclName})
		require.NoError(t, err)
		return l
	}
	table := make([]unsafe.Pointer, 3)
	optional := []Symbol{{Name: "smtest_version"}, {Name: "smtest_gone", Alt: []string{"smtest_old"}}, {Name: "smtest_new", Since: 22900, Optional: true}}

	missing, err := open(old).Resolve(optional, 22800, "2.28.0", unsafe.Pointer(&table[0]))
	require.NoError(t, err)
	assert.Equal(t, []string{"smtest_new"}, missing)
	assert.NotNil(t, table[0])
	assert.NotNil(t, table[1], "the older name fills the slot")
	assert.Nil(t, table[2])

	required := []Symbol{{Name: "smtest_version"}, {Name: "smtest_new", Since: 22900}}
	table = make([]unsafe.Pointer, 2)
	_, err = open(old).Resolve(required, 22800, "2.28.0", unsafe.Pointer(&table[0]))
	require.Error(t, err)
	assert.Equal(t, core.ErrUnavailable, core.CodeOf(err))
	assert.Contains(t, err.Error(), old)
	assert.Contains(t, err.Error(), "version 2.28.0")
	assert.Contains(t, err.Error(), "smtest_new came with version 2.29.0")
	assert.Nil(t, table[0], "nothing is written unless every required symbol resolved")

	missing, err = open(cur).Resolve(required, 22900, "2.29.0", unsafe.Pointer(&table[0]))
	require.NoError(t, err)
	assert.Empty(t, missing)
	assert.NotNil(t, table[1])
}

// A 10 KiB path in the variable comes back once, cut (Note [Bounded
// messages]), with the loader's reason when it gave one.
func TestOpenLibraryLongExplicitPath(t *testing.T) {
	spec := LibrarySpec{What: "the test library", Env: "SYMMEM_LIBSMTEST_L", Sonames: []string{"libsmtest_l.so.1"}}
	long := "/" + strings.Repeat("p", 10239)
	t.Setenv(spec.Env, long)
	_, err := OpenLibrary(spec)
	require.Error(t, err)
	assert.Equal(t, core.ErrUnavailable, core.CodeOf(err))
	assert.Less(t, len(err.Error()), 1024, err.Error())
	assert.Contains(t, err.Error(), "(10240 characters)")
	assert.Equal(t, 1, strings.Count(err.Error(), strings.Repeat("p", 63)), err.Error())

	assert.Equal(t, "cannot open shared object file", withoutPath("/x/y.so: cannot open shared object file", "/x/y.so"))
	assert.Equal(t, "the loader's message names only the path", withoutPath(long[:511], long))
	assert.Equal(t, "other", withoutPath("other", "/x/y.so"))
}
