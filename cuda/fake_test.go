package cuda

// Runs the GPU suite (TestBackend*) and the loader's failure paths against
// testdata/fakecuda.c, a stand-in libcuda built here with the C compiler.
// Each run is a child process (this test binary again): a process loads one
// driver library, and on a GPU machine this one may hold the real driver.

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libsymmem/libsymmem/core"
)

const (
	envFake   = "SYMMEM_CUDA_TEST_FAKE"   // "1" in a child running against the fake
	envExpect = "SYMMEM_CUDA_TEST_EXPECT" // what TestChildOpenError expects in the error
)

// buildFake compiles testdata/fakecuda.c into a shared library in a
// temporary directory, or skips the test when there is no C compiler.
func buildFake(t *testing.T, name string, defines ...string) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler to build the fake driver: %v", err)
	}
	out := filepath.Join(t.TempDir(), name)
	args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-I.", "-o", out}, defines...)
	args = append(args, "testdata/fakecuda.c", "-lpthread")
	if msg, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("building the fake driver: %v\n%s", err, msg)
	}
	return out
}

// runChild runs this test binary with -test.run=pattern and extra
// environment, and returns its output and error.
func runChild(t *testing.T, pattern string, env ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run="+pattern, "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestFakeDriverSuite(t *testing.T) {
	if isFake() {
		t.Skip("already running against the fake driver")
	}
	lib := buildFake(t, "libcuda_fake.so")
	out, err := runChild(t, "^TestBackend", EnvLibrary+"="+lib, envRequireGPU+"=1", envFake+"=1")
	if err != nil {
		t.Fatalf("the GPU suite failed against the fake driver: %v\n%s", err, out)
	}
	results := regexp.MustCompile(`(?m)^\s*--- (PASS|SKIP|FAIL): \S+.*$`).FindAllString(out, -1)
	require.NotEmpty(t, results, "no test ran in the child:\n%s", out)
	t.Logf("against %s:\n%s", lib, strings.Join(results, "\n"))
	assert.Contains(t, out, "--- PASS: TestBackendStreamOps")
	assert.Contains(t, out, "--- PASS: TestBackendCrossProcess")
}

func TestFakeDriverOpenErrors(t *testing.T) {
	if isFake() {
		t.Skip("already running against the fake driver")
	}
	lib := buildFake(t, "libcuda_fake.so")
	old := buildFake(t, "libcuda_old.so", "-DFAKECUDA_NO_MEMCREATE")
	for name, tc := range map[string]struct {
		lib, env, expect string
	}{
		"cuInit fails": {lib, "FAKECUDA_INIT_FAIL=1", "cuInit(0) failed with the driver"},
		"no devices":   {lib, "FAKECUDA_DEVICES=0", "reports no devices"},
		"old driver":   {old, "", "has no function cuMemCreate: it is too old"},
	} {
		t.Run(name, func(t *testing.T) {
			env := []string{EnvLibrary + "=" + tc.lib, envExpect + "=" + tc.expect}
			if tc.env != "" {
				env = append(env, tc.env)
			}
			out, err := runChild(t, "^TestChildOpenError$", env...)
			require.NoError(t, err, "child:\n%s", out)
			require.Contains(t, out, "--- PASS: TestChildOpenError", "child:\n%s", out)
			t.Log(regexp.MustCompile(`(?m)^.*New: .*$`).FindString(out))
		})
	}
}

// TestChildOpenError is a child of TestFakeDriverOpenErrors: New must fail
// with core.ErrUnavailable and a message containing $SYMMEM_CUDA_TEST_EXPECT.
func TestChildOpenError(t *testing.T) {
	expect := os.Getenv(envExpect)
	if expect == "" {
		t.Skip("runs only as a child of TestFakeDriverOpenErrors")
	}
	b, err := New()
	require.Error(t, err)
	require.Nil(t, b)
	t.Logf("New: %v", err)
	assert.Contains(t, err.Error(), expect)
	assert.Contains(t, err.Error(), os.Getenv(EnvLibrary), "the message must name the library")
	assert.Equal(t, core.ErrUnavailable, core.CodeOf(err))
}

// The fabric path on the stand-in driver: fabric handles accepted
// (FAKECUDA_FABRIC_OK) and a fabric cluster reported, or no cluster.
func TestFakeDriverFabric(t *testing.T) {
	if isFake() {
		t.Skip("already running against the fake driver")
	}
	lib := buildFake(t, "libcuda_fake.so")
	out, err := runChild(t, "^TestBackendFabricDomain$", EnvLibrary+"="+lib, envRequireGPU+"=1", envFake+"=1",
		"FAKECUDA_FABRIC_OK=1", "FAKECUDA_FABRIC_CLUSTER=rack-1", "FAKECUDA_FABRIC_CLIQUE=7")
	require.NoError(t, err, "child:\n%s", out)
	assert.Regexp(t, `fabric domain of device 0: "[0-9a-f]{32}/7"`, out)
	assert.Contains(t, out, "fabric handle round trip: ok")
	out, err = runChild(t, "^TestBackendFabricDomain$", EnvLibrary+"="+lib, envRequireGPU+"=1", envFake+"=1", "FAKECUDA_FABRIC_OK=1")
	require.NoError(t, err, "child:\n%s", out)
	assert.Contains(t, out, "the driver does not name the GPU's fabric cluster")
}
