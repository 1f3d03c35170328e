package alloc_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/host"
)

func TestCheckRangeKnowsBlocksAndMappings(t *testing.T) {
	be, err := host.New()
	require.NoError(t, err)
	rt := alloc.NewRuntime(be)
	a, err := rt.Allocator(0)
	require.NoError(t, err)
	p, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	known, err := rt.CheckRange(p, 4096, "dst")
	require.True(t, known)
	require.NoError(t, err)
	known, err = rt.CheckRange(p+100, 4000, "dst")
	require.True(t, known)
	require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err))
	require.Contains(t, err.Error(), "past the end of its block")

	// A registered mapping (a peer's segment) bounds accesses the same way.
	core.RegisterRange(0x7000_0000_0000, 1<<20, "rank 1 (pid 7)'s segment")
	defer core.UnregisterRange(0x7000_0000_0000)
	known, err = rt.CheckRange(0x7000_0000_0000+(1<<20)-8, 8, "src")
	require.True(t, known)
	require.NoError(t, err)
	_, err = rt.CheckRange(0x7000_0000_0000+(1<<20)-8, 9, "src")
	require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err))
	require.Contains(t, err.Error(), "rank 1 (pid 7)'s segment")
	core.UnregisterRange(0x7000_0000_0000)
	known, err = rt.CheckRange(0x7000_0000_0000, 1<<30, "src")
	require.False(t, known)
	require.NoError(t, err)
	_, err = rt.CheckRange(^uintptr(0)-4, 16, "dst")
	require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err))
}
