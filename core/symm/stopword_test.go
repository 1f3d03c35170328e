package symm

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/symm/coll"
	"github.com/libsymmem/libsymmem/core/unmanaged"
	"github.com/stretchr/testify/require"
)

// Every collective enters through Port.Enter, which reads the stop word
// where the host can read it with one load (Note [Failed collectives] in
// core/symm/coll): the region's word on the host backend, the pinned
// mirror that kernels write on cuda (here the stand-in driver under
// SYMMEM_BACKEND=cuda). Once it holds a peer's giving up, every
// collective fails at once naming it, and the device error text says the
// same.
func TestStopWordRefusesCollectives(t *testing.T) {
	be := faultBackend(t)
	e := &rankEnv{rt: alloc.NewRuntime(be), rank: 0, world: 1, name: "stop-word", dir: sockDir(t), timeout: 3 * time.Second}
	a, err := e.rt.Allocator(0)
	require.NoError(t, err)
	h, fin, err := joinRendezvous(e, a, 64<<10)
	require.NoError(t, err)
	defer fin()
	word := h.padPtrs[0] + h.padSize + 4*core.DevStopWord
	if be.Capabilities().StreamSignals {
		require.NotZero(t, h.stopMirror, "a backend that runs kernels needs the pinned mirror")
		word = h.stopMirror
	} else {
		require.Zero(t, h.stopMirror)
	}
	require.Equal(t, word, h.stopRead)
	require.NoError(t, h.CollectivesStopped())
	args := coll.Args{Kind: core.AllReduce, DType: core.Float32, Op: core.OpSum, Count: 64}
	if !be.Capabilities().StreamSignals {
		require.NoError(t, coll.Run(h, args))
	}
	// Rank 5 of the group gave up at device set 66 (channel 1, block 2)
	// after its wait timed out.
	gave := core.DevGaveUp(5, core.DevCauseTimeout, 66)
	atomic.StoreUint32((*uint32)(unmanaged.Pointer(word)), gave)
	err = coll.Run(h, args)
	require.Equal(t, core.ErrInvalidState, core.CodeOf(err), "%v", err)
	for _, s := range []string{"collectives are stopped since rank 5 gave up a collective (collective channel 1, kernel block 2 (device set 66)): its wait timed out",
		"abort the group (symmem_group_abort), destroy it and create a new one"} {
		require.True(t, strings.Contains(err.Error(), s), "%q lacks %q", err, s)
	}
	// Arguments that would be refused are not looked at: the group is
	// stopped first.
	err = coll.Run(h, coll.Args{Kind: core.AllReduce, DType: core.Float32, Op: core.OpSum, Count: 1 << 40})
	require.Equal(t, core.ErrInvalidState, core.CodeOf(err), "%v", err)
	require.Equal(t, err.Error(), h.DeviceErrorText(gave).Error())

	// A rank whose kernel found the group stopped by rank 5's finding
	// other arguments reports the mismatch, as rank 5 does.
	mism := h.DeviceErrorText(core.DevGaveUp(5, core.DevCauseMismatch, 66))
	require.Equal(t, core.ErrMismatch, core.CodeOf(mism), "%v", mism)
	require.Contains(t, mism.Error(), "rank 5 gave up a collective (collective channel 1, kernel block 2 (device set 66)): it found other collective arguments")
	require.Equal(t, core.ErrInvalidState, core.CodeOf(h.CollectivesStopped()), "later collectives are refused as for any stop")
}
