package cuda

// NCCL loading against testdata/fakenccl.c. NCCL is loaded once per process
// and never unloaded, so each case runs in a child process (this test
// binary again).

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libsymmem/libsymmem/core"
)

const envNCCLExpect = "SYMMEM_NCCL_TEST_EXPECT" // what TestChildLoadNCCL expects

func buildFakeNCCL(t *testing.T, name string, defines ...string) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler to build the NCCL stand-in: %v", err)
	}
	out := filepath.Join(t.TempDir(), name)
	args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-Wl,-soname,libnccl.so.2", "-o", out}, defines...)
	args = append(args, "testdata/fakenccl.c", "-lpthread")
	if msg, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("building the NCCL stand-in: %v\n%s", err, msg)
	}
	return out
}

// A process that never asks for NCCL never loads it: this test process
// has used the driver's loader (and maybe the fake driver) but no NCCL.
func TestNCCLNotLoadedUnlessAsked(t *testing.T) {
	ncclMu.Lock()
	loaded := ncclInfo != nil
	ncclMu.Unlock()
	require.False(t, loaded, "no test in this process loads NCCL (they run in children)")
	for _, obj := range loadedObjects() {
		assert.NotContains(t, filepath.Base(obj), "libnccl", "NCCL is loaded but nobody asked for it")
	}
}

func TestLoadNCCL(t *testing.T) {
	if os.Getenv(envNCCLExpect) != "" {
		t.Skip("running as a child")
	}
	cur := buildFakeNCCL(t, "libnccl_fake.so")
	old := buildFakeNCCL(t, "libnccl_fake_228.so", "-DFAKENCCL_NO_PEER_POINTER")
	for name, tc := range map[string]struct {
		env    []string
		expect string
	}{
		"2.29 with peer pointers": {[]string{EnvNCCL + "=" + cur}, "ok 22900 peer=true"},
		"2.28 without":            {[]string{EnvNCCL + "=" + old}, "ok 22809 peer=false"},
		"too old":                 {[]string{EnvNCCL + "=" + cur, "FAKENCCL_VERSION=22704"}, "is NCCL 2.27.4; libsymmem needs NCCL 2.28.0 or newer"},
		"2.29 lacking its symbol": {[]string{EnvNCCL + "=" + old, "FAKENCCL_VERSION=22900"}, "ok 22900 peer=false"},
		"missing":                 {[]string{EnvNCCL + "=/nonexistent/libnccl.so.2"}, `cannot load NCCL from SYMMEM_LIBNCCL="/nonexistent/libnccl.so.2"`},
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestChildLoadNCCL$", "-test.count=1", "-test.v")
			cmd.Env = append(append(os.Environ(), tc.env...), envNCCLExpect+"="+tc.expect)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "child:\n%s", out)
			require.Contains(t, string(out), "--- PASS: TestChildLoadNCCL", "child:\n%s", out)
		})
	}
}

// TestChildLoadNCCL is a child of TestLoadNCCL: LoadNCCL must give what
// $SYMMEM_NCCL_TEST_EXPECT says ("ok <version> peer=<bool>", or a part of
// the error of code ErrUnavailable).
func TestChildLoadNCCL(t *testing.T) {
	expect := os.Getenv(envNCCLExpect)
	if expect == "" {
		t.Skip("runs only as a child of TestLoadNCCL")
	}
	info, err := LoadNCCL()
	if strings.HasPrefix(expect, "ok ") {
		require.NoError(t, err)
		var got string
		if info.PeerPointers {
			got = "peer=true"
		} else {
			got = "peer=false"
		}
		assert.Equal(t, expect, fmt.Sprintf("ok %d %s", info.Version, got))
		assert.Equal(t, os.Getenv(EnvNCCL), info.Path)
		return
	}
	require.Error(t, err)
	t.Logf("LoadNCCL: %v", err)
	assert.Equal(t, core.ErrUnavailable, core.CodeOf(err))
	assert.Contains(t, err.Error(), expect)
}
