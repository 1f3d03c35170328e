package host

import (
	"os"
	"os/exec"
	"testing"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/unmanaged"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

const segSize = 2 << 20

func bytesAt(addr, n uintptr) []byte { return unsafe.Slice((*byte)(unmanaged.Pointer(addr)), n) }

// mapNew makes a segment and maps it in a fresh reservation.
func mapNew(t *testing.T, b *Backend, m core.Memory) uintptr {
	addr, err := b.Reserve(0, segSize)
	require.NoError(t, err)
	require.NoError(t, b.Map(0, addr, segSize, m))
	t.Cleanup(func() {
		require.NoError(t, b.Unmap(0, addr, segSize))
		require.NoError(t, b.Unreserve(0, addr, segSize))
	})
	return addr
}

func TestTwoMappingsShareMemory(t *testing.T) {
	b, err := New()
	require.NoError(t, err)
	m, err := b.Create(0, segSize)
	require.NoError(t, err)
	a1 := mapNew(t, b, m)
	fd, err := b.Export(m)
	require.NoError(t, err)
	m2, err := b.Import(0, fd)
	require.NoError(t, err)
	a2 := mapNew(t, b, m2)
	require.NoError(t, b.Memset(0, 0, a1, 0xab, segSize))
	require.Equal(t, byte(0xab), bytesAt(a2, segSize)[segSize-1])
	require.NoError(t, b.StreamMemOps(0, 0, []core.MemOp{{Addr: a2 + 64, Value: 7}}, time.Second))
	require.NoError(t, b.StreamMemOps(0, 0, []core.MemOp{{Addr: a1 + 64, Value: 7, Wait: true}}, time.Second))
	err = b.StreamMemOps(0, 0, []core.MemOp{{Addr: a1 + 64, Value: 8, Wait: true}}, 20*time.Millisecond)
	require.Equal(t, core.ErrTimeout, core.CodeOf(err))
	require.NoError(t, b.StreamMemOps(0, 0, []core.MemOp{{Addr: a1 + 64, Value: 6, Wait: true, AtLeast: true}}, time.Second), "a count of 7 has reached 6")
	require.NoError(t, b.Release(m))
	require.NoError(t, b.Release(m2))
}

func TestBadDeviceAndHugeSegment(t *testing.T) {
	b, err := New()
	require.NoError(t, err)
	_, err = b.Create(1, segSize)
	require.Equal(t, core.ErrInvalidDevice, core.CodeOf(err))
	_, err = b.Create(0, uintptr(b.total)+segSize)
	require.Equal(t, core.ErrOutOfMemory, core.CodeOf(err))
}

// TestExportToAnotherProcess sends a segment's memfd to a child process,
// which maps it, checks the parent's pattern and answers with its own.
func TestExportToAnotherProcess(t *testing.T) {
	if os.Getenv("SYMMEM_HOST_CHILD") == "1" {
		t.Skip("parent side only")
	}
	b, err := New()
	require.NoError(t, err)
	m, err := b.Create(0, segSize)
	require.NoError(t, err)
	defer b.Release(m)
	addr := mapNew(t, b, m)
	buf := bytesAt(addr, segSize)
	for i := range buf[:4096] {
		buf[i] = byte(i * 7)
	}
	fd, err := b.Export(m)
	require.NoError(t, err)
	f := os.NewFile(uintptr(fd), "segment")
	defer f.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildMapsExportedSegment$", "-test.v")
	cmd.Env = append(os.Environ(), "SYMMEM_HOST_CHILD=1")
	cmd.ExtraFiles = []*os.File{f} // fd 3 in the child
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	require.Contains(t, string(out), "--- PASS: TestChildMapsExportedSegment")
	for i := 0; i < 4096; i++ {
		require.Equal(t, byte(i*3), buf[segSize-4096+i], "child's write at %d", i)
	}
}

func TestChildMapsExportedSegment(t *testing.T) {
	if os.Getenv("SYMMEM_HOST_CHILD") != "1" {
		t.Skip("runs as the child of TestExportToAnotherProcess")
	}
	b, err := New()
	require.NoError(t, err)
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(3, &st))
	m, err := b.Import(0, 3)
	require.NoError(t, err)
	addr := mapNew(t, b, m)
	buf := bytesAt(addr, segSize)
	for i := 0; i < 4096; i++ {
		require.Equal(t, byte(i*7), buf[i])
		buf[segSize-4096+i] = byte(i * 3)
	}
	require.NoError(t, b.Release(m))
}
