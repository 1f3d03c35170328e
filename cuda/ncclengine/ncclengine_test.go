package ncclengine

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/symm"
	"github.com/libsymmem/libsymmem/cuda"
	"github.com/libsymmem/libsymmem/cuda/internal/nccltest"
)

// The optional interfaces of core/symm/engine.go, as core/symm asserts them.
type (
	reducer interface {
		AllReduce(stream core.Stream, send, recv, count uintptr, dt core.DType, op core.ReduceOp) error
		ReduceScatter(stream core.Stream, send, recv, recvCount uintptr, dt core.DType, op core.ReduceOp) error
		AllGatherTyped(stream core.Stream, send, recv, sendCount uintptr, dt core.DType) error
	}
	splitter interface {
		Split(color, key int) (symm.Communicator, error)
	}
	closer   interface{ Close() error }
	oneSided interface {
		OneSided() (ok bool, version string)
		Signal(stream core.Stream, peer, slot int) error
		WaitSignal(stream core.Stream, peer, slot, count int) error
	}
	lsaTeam interface {
		LSAPeers() (peers []int, ok bool, err error)
	}
)

var (
	_ reducer  = Comm{}
	_ splitter = Comm{}
	_ closer   = Comm{}
	_ oneSided = Comm{}
	_ lsaTeam  = Comm{}
)

func buildFakeNCCL(t *testing.T) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler to build the NCCL stand-in: %v", err)
	}
	out := filepath.Join(t.TempDir(), "libnccl_fake.so")
	msg, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-Wl,-soname,libnccl.so.2", "-o", out,
		"../testdata/fakenccl.c", "-lpthread").CombinedOutput()
	require.NoError(t, err, "%s", msg)
	return out
}

// Four ranks as goroutines of this process, each with its communicator of
// the stand-in, seen through New as core/symm sees a group's communicator:
// splits give wrapped children that reduce, split again and close.
func TestSplitThroughTheEngineInterfaces(t *testing.T) {
	lib := buildFakeNCCL(t)
	t.Setenv(cuda.EnvNCCL, lib)
	t.Setenv("TMPDIR", t.TempDir())
	const world = 4
	var wg sync.WaitGroup
	for r := 0; r < world; r++ {
		wg.Add(1)
		go func(rank int) {
			defer wg.Done()
			ptr, err := nccltest.InitRank(lib, "ncclengine-"+t.Name(), world, rank)
			if !assert.NoError(t, err) {
				return
			}
			defer nccltest.Destroy(lib, ptr)
			c, err := cuda.OpenNCCLComm(ptr)
			if !assert.NoError(t, err) {
				return
			}
			var comm symm.Communicator = New(c)
			child, err := comm.(splitter).Split(rank%2, rank)
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
			assert.NoError(t, child.(reducer).AllReduce(0, addr, addr, 1, core.Int32, core.OpSum))
			want := map[int]int32{0: 1 + 3, 1: 2 + 4}[rank%2]
			assert.Equal(t, want, *(*int32)(unsafe.Pointer(&buf[0])), "rank %d: the sum over its child", rank)
			// A child splits again (everyone alone), then both close.
			grand, err := child.(splitter).Split(child.Rank(), 0)
			if assert.NoError(t, err) && assert.NotNil(t, grand) {
				assert.Equal(t, 1, grand.World())
				assert.NoError(t, grand.(closer).Close())
			}
			assert.NoError(t, child.(closer).Close())
			// NCCL_SPLIT_NOCOLOR: no child, and no non-nil interface holding nil.
			none, err := comm.(splitter).Split(cuda.NCCLSplitNoColor, 0)
			assert.NoError(t, err)
			assert.Nil(t, none)
		}(r)
	}
	wg.Wait()
	assert.Nil(t, New(nil))
}
