package symm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/symm/coll"
)

// A handle's description is what its getters say, made once: asking for
// it again gives the same slices, and a collective's entry copies it
// without allocating more than the call's admission does.
func TestHandleDescription(t *testing.T) {
	be := faultBackend(t)
	e := &rankEnv{rt: alloc.NewRuntime(be), rank: 0, world: 1, name: "description", dir: sockDir(t), timeout: 3 * time.Second}
	a, err := e.rt.Allocator(0)
	require.NoError(t, err)
	h, fin, err := joinRendezvous(e, a, 64<<10)
	require.NoError(t, err)
	defer fin()
	d := h.Symmetric()
	_, bufArr := h.BufferPtrs()
	_, padArr := h.SignalPadPtrs()
	require.Equal(t, "description", d.GroupName)
	require.Equal(t, []any{h.Rank(), h.World(), h.BufferSize(), h.Offset(), h.SignalPadSize(), bufArr, padArr, h.stopMirror, 0},
		[]any{d.Rank, d.World, d.BufferSize, d.Offset, d.SignalPadSize, d.BufferArray, d.PadArray, d.StopMirror, d.Device})
	require.Equal(t, h.Buffers(), d.Buffers)
	require.Equal(t, h.SignalPads(), d.SignalPads)
	require.Equal(t, 3*time.Second, d.Timeout)
	require.Nil(t, d.Span, "one machine")
	require.Zero(t, d.TeamBufferArray)
	require.Same(t, &d.Buffers[0], &h.Symmetric().Buffers[0], "the handle's own slice, not a copy")
	require.NotNil(t, d.Attached)

	noop := coll.Args{Kind: core.AllReduce, DType: core.Float32}
	entry := testing.AllocsPerRun(100, func() { _ = coll.Run(h, noop) })
	admission := testing.AllocsPerRun(100, func() {
		leave, err := h.Enter()
		if err == nil {
			leave()
		}
	})
	require.Equal(t, admission, entry, "a collective's entry allocates only what its admission does")
}
