package core_test

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

func TestGuardedAccessTurnsFaultsIntoErrors(t *testing.T) {
	p, err := unix.Mmap(-1, 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	require.NoError(t, err)
	addr := uintptr(unsafe.Pointer(&p[0]))
	require.NoError(t, unix.Munmap(p))
	for _, at := range []uintptr{addr, 0x10} {
		err = core.GuardedAccess("test write", func() {
			// Not unsafe.Add: checkptr (-race) rejects arithmetic on nil.
			*(*byte)(unmanaged.Pointer(at)) = 1
		})
		require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "%#x: %v", at, err)
	}
	ok := 0
	require.NoError(t, core.GuardedAccess("fine", func() { ok = 1 }))
	require.Equal(t, 1, ok)
	require.Panics(t, func() { core.GuardedAccess("other panic", func() { panic("boom") }) })
}

func TestSealedMemfds(t *testing.T) {
	fd, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.Ftruncate(fd, 8192))
	_, err = core.PeerMemfdSize(fd)
	require.Equal(t, core.ErrPeer, core.CodeOf(err), "unsealed")
	require.NoError(t, core.SealSize(fd))
	n, err := core.PeerMemfdSize(fd)
	require.NoError(t, err)
	require.Equal(t, uint64(8192), n)
	require.Error(t, unix.Ftruncate(fd, 0), "a sealed memfd cannot shrink")
}
