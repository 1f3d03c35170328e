package cuda

// Tests that run on any machine: loading errors, error mapping, and the
// promises about what the package links and calls. The GPU suite is in
// backend_test.go; fake_test.go runs it against testdata/fakecuda.c.

import (
	"debug/elf"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libsymmem/libsymmem/core"
)

func TestOpenMissingLibraryNamesThePath(t *testing.T) {
	const path = "/nonexistent/libcuda.so.1"
	t.Setenv(EnvLibrary, path)
	core.ReloadSettings()
	t.Cleanup(func() { core.ReloadSettings() })

	b, err := Open()
	require.Error(t, err)
	assert.Nil(t, b, "Open must return a nil interface on failure")
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), EnvLibrary)
	assert.Equal(t, core.ErrUnavailable, core.CodeOf(err))
	t.Logf("Open: %v", err)

	// Through core's registry: selecting "cuda" fails with the reason, and
	// automatic selection notes why cuda was skipped.
	_, _, err = core.OpenBackend("cuda")
	require.Error(t, err)
	assert.Contains(t, err.Error(), path)
	assert.Equal(t, core.ErrUnavailable, core.CodeOf(err))
	_, notes, _ := core.OpenBackend("auto")
	assert.True(t, containsAny(notes, path), "auto selection should note why cuda was skipped, got %q", notes)
}

func TestPackageQueriesFailWithoutDriver(t *testing.T) {
	if gpuLoaded() {
		t.Skip("a driver is already loaded in this process")
	}
	t.Setenv(EnvLibrary, "/nonexistent/libcuda.so.1")
	core.ReloadSettings()
	t.Cleanup(func() { core.ReloadSettings() })
	_, err := DriverVersion()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "/nonexistent/libcuda.so.1")
	_, err = DeviceName(0)
	require.Error(t, err)
}

// gpuLoaded tells whether a driver library is loaded in this test process.
func gpuLoaded() bool {
	libMu.Lock()
	defer libMu.Unlock()
	return driver != nil
}

func containsAny(list []string, sub string) bool {
	for _, s := range list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

func TestResultCodes(t *testing.T) {
	for res, want := range map[int]core.Code{
		0:   core.Success,
		1:   core.ErrBackend, // CUDA_ERROR_INVALID_VALUE
		2:   core.ErrOutOfMemory,
		100: core.ErrUnavailable, // CUDA_ERROR_NO_DEVICE
		101: core.ErrInvalidDevice,
		201: core.ErrBackend, // CUDA_ERROR_INVALID_CONTEXT
		700: core.ErrBackend, // CUDA_ERROR_ILLEGAL_ADDRESS
		800: core.ErrPermission,
		801: core.ErrUnavailable,
		999: core.ErrBackend,
	} {
		assert.Equal(t, want, resultCode(res), "CUresult %d", res)
	}
}

func TestDriverErrorMessage(t *testing.T) {
	err := driverError("cuMemCreate", 3, 2)
	assert.Equal(t, core.ErrOutOfMemory, err.Code)
	// With a driver loaded the name comes from cuGetErrorName, without one
	// it is spelled from the number.
	assert.Regexp(t, regexp.MustCompile(
		`^cuda: cuMemCreate failed on device 3: (CUDA_ERROR_OUT_OF_MEMORY|CUDA_ERROR_2) \(.+\)$`), err.Error())
	err = driverError("cuInit", -1, 100)
	assert.Regexp(t, `^cuda: cuInit failed: (CUDA_ERROR_NO_DEVICE|CUDA_ERROR_100) \(.+\)$`, err.Error())
}

func TestUUIDString(t *testing.T) {
	u := UUID{0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef}
	assert.Equal(t, "GPU-12345678-9abc-def0-0123-456789abcdef", u.String())
}

// The package must never link the driver or the runtime: the test binary
// links this package's cgo code, so its DT_NEEDED list is the evidence.
func TestNoCUDALibraryLinked(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	f, err := elf.Open(exe)
	require.NoError(t, err)
	defer f.Close()
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	t.Logf("DT_NEEDED of the test binary: %v", libs)
	for _, l := range libs {
		for _, bad := range []string{"libcuda", "libcudart", "libnvidia"} {
			assert.NotContains(t, l, bad, "the cuda package must load the driver with dlopen, not link it")
		}
	}
}

// No multicast object may be created by this package (project rule); only
// the MULTICAST_SUPPORTED attribute may be named.
func TestNoMulticastCalls(t *testing.T) {
	forbidden := "cu" + "Multicast" // spelled apart so this file passes
	var files []string
	for _, pat := range []string{"*.go", "*.c", "*.h", "testdata/*.c", "abicheck/*"} {
		m, err := filepath.Glob(pat)
		require.NoError(t, err)
		files = append(files, m...)
	}
	require.NotEmpty(t, files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, forbidden) {
				t.Errorf("%s:%d names a multicast driver function: %s", f, i+1, strings.TrimSpace(line))
			}
		}
	}
}
