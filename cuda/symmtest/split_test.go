package symmtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"golang.org/x/sys/unix"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/symm"
	"github.com/libsymmem/libsymmem/cuda"
	"github.com/libsymmem/libsymmem/cuda/internal/nccltest"
)

// buildFakeNCCL compiles cuda's NCCL stand-in (cuda/testdata/fakenccl.c)
// as name in a temporary folder, with the given -D defines.
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
	args = append(args, "../testdata/fakenccl.c", "-lpthread")
	if msg, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("building the NCCL stand-in: %v\n%s", err, msg)
	}
	return out
}

// Four ranks as goroutines of this process, each with its communicator of
// the stand-in, seen as core/symm sees a group's communicator (a
// core.Communicator and its capabilities): splits give children that
// reduce, split again and close.
func TestSplitThroughTheEngineInterfaces(t *testing.T) {
	lib := buildFakeNCCL(t, "libnccl_fake.so")
	t.Setenv(cuda.EnvNCCL, lib)
	t.Setenv("TMPDIR", t.TempDir())
	const world = 4
	var wg sync.WaitGroup
	for r := 0; r < world; r++ {
		wg.Add(1)
		go func(rank int) {
			defer wg.Done()
			ptr, err := nccltest.InitRank(lib, "symmtest-"+t.Name(), world, rank)
			if !assert.NoError(t, err) {
				return
			}
			defer nccltest.Destroy(lib, ptr)
			c, err := cuda.OpenNCCLComm(ptr)
			if !assert.NoError(t, err) {
				return
			}
			var comm symm.Communicator = c
			child, err := comm.(core.Splitter).Split(rank%2, rank)
			if !assert.NoError(t, err) || !assert.NotNil(t, child) {
				return
			}
			assert.Equal(t, 2, child.World())
			assert.Equal(t, rank/2, child.Rank())
			buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
			if !assert.NoError(t, err) {
				return
			}
			defer unix.Munmap(buf)
			*(*int32)(unsafe.Pointer(&buf[0])) = int32(rank + 1)
			addr := uintptr(unsafe.Pointer(&buf[0]))
			assert.NoError(t, child.(core.Reducer).AllReduce(0, addr, addr, 1, core.Int32, core.OpSum))
			want := map[int]int32{0: 1 + 3, 1: 2 + 4}[rank%2]
			assert.Equal(t, want, *(*int32)(unsafe.Pointer(&buf[0])), "rank %d: the sum over its child", rank)
			// A child splits again (everyone alone), then both close.
			grand, err := child.(core.Splitter).Split(child.Rank(), 0)
			if assert.NoError(t, err) && assert.NotNil(t, grand) {
				assert.Equal(t, 1, grand.World())
				assert.NoError(t, grand.(core.Closer).Close())
			}
			assert.NoError(t, child.(core.Closer).Close())
			// NCCL_SPLIT_NOCOLOR: no child, and no non-nil interface holding nil.
			none, err := comm.(core.Splitter).Split(cuda.NCCLSplitNoColor, 0)
			assert.NoError(t, err)
			assert.Nil(t, none)
		}(r)
	}
	wg.Wait()
}
