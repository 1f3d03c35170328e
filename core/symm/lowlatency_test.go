package symm

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymmem/libsymmem/core"
)

// kernelBackend launches collectives: it records what it was given.
type kernelBackend struct {
	core.Backend
	launched []*core.Collective
}

func (k *kernelBackend) LaunchCollective(dev int, s core.Stream, c *core.Collective) error {
	k.launched = append(k.launched, c)
	return nil
}

// planHandle is a handle of rank 1 of 2 on be, enough for plan.
func planHandle(be core.Backend) *Handle {
	return &Handle{gm: &groupMem{be: be}, name: "ll", rank: 1, world: 2, bufSize: 8 << 20, padSize: 64 << 10,
		bufPtrs: []uintptr{0x100000, 0x200000}, padPtrs: []uintptr{0x9000000, 0xa000000}, life: newLifetime()}
}

// Note [Low-latency collectives]: auto takes the low-latency path for what
// fits the buffers on a backend that launches kernels, an explicit
// low_latency that cannot run says why, and the host backend runs it as
// one_shot.
func TestLowLatencyPlan(t *testing.T) {
	h := planHandle(&kernelBackend{})
	c, err := h.plan(CollArgs{Kind: core.AllReduce, DType: core.BFloat16, Count: 2048})
	require.NoError(t, err)
	require.Equal(t, core.AlgoLowLatency, c.Algo)
	require.Equal(t, uint32(core.KernelLowLatency), c.KernelAlgo())
	require.Equal(t, llOffset(64<<10, 2), c.LLOffset)
	require.Equal(t, 2*LowLatencyMaxBytes, c.LLSlot)
	require.Equal(t, h.padPtrs, c.PadAddrs)
	require.Equal(t, uint64(core.KernelLowLatency), argsWord(c)>>59&7, "the digest covers the path")
	require.Contains(t, argsText(argsWord(c)), "low_latency")
	require.Zero(t, llOffset(64<<10, 2)%256)
	require.GreaterOrEqual(t, llOffset(64<<10, 2), 64<<10+deviceRegionBytes(2))

	// Past the buffers: the barrier kernels.
	c, err = h.plan(CollArgs{Kind: core.AllReduce, DType: core.BFloat16, Count: (LowLatencyMaxBytes + 2) / 2})
	require.NoError(t, err)
	require.NotEqual(t, core.AlgoLowLatency, c.Algo)
	// An explicit one_shot stays one_shot.
	c, err = h.plan(CollArgs{Kind: core.AllReduce, DType: core.BFloat16, Count: 2048, Algo: core.AlgoOneShot})
	require.NoError(t, err)
	require.Equal(t, core.AlgoOneShot, c.Algo)
	// all_gather and reduce_scatter: a multiple of 8 bytes per rank and peer.
	c, err = h.plan(CollArgs{Kind: core.AllGather, DType: core.Float32, Count: 64, Out: 0x300000})
	require.NoError(t, err)
	require.Equal(t, core.AlgoLowLatency, c.Algo)
	c, err = h.plan(CollArgs{Kind: core.ReduceScatter, DType: core.BFloat16, Count: 6, Out: 0x300000})
	require.NoError(t, err)
	require.Equal(t, core.AlgoOneShot, c.Algo, "3 bf16 per peer: 6 bytes")

	for _, tc := range []struct {
		args CollArgs
		why  string
	}{
		{CollArgs{Kind: core.AllReduce, DType: core.Float32, Count: 64, Algo: core.AlgoLowLatency, Channel: 1}, "only collective channel 0"},
		{CollArgs{Kind: core.AllReduce, DType: core.Float32, Count: LowLatencyMaxBytes, Algo: core.AlgoLowLatency}, "SYMMEM_LL_MAX_BYTES"},
		{CollArgs{Kind: core.ReduceScatter, DType: core.Float32, Count: 2, Out: 0x300000, Algo: core.AlgoLowLatency}, "not a multiple of 8"},
	} {
		_, err := h.plan(tc.args)
		require.Error(t, err)
		require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err))
		require.True(t, strings.Contains(err.Error(), tc.why), err.Error())
	}

	// Past llMaxWorld ranks: no buffers, the barrier kernels.
	big := planHandle(&kernelBackend{})
	big.world = llMaxWorld + 1
	big.bufPtrs, big.padPtrs = make([]uintptr, big.world), make([]uintptr, big.world)
	big.bufPtrs[1] = 0x100000
	c, err = big.plan(CollArgs{Kind: core.AllReduce, DType: core.Float32, Count: 64})
	require.NoError(t, err)
	require.NotEqual(t, core.AlgoLowLatency, c.Algo)
	require.Zero(t, llAreaBytes(big.world))

	// A backend that runs no kernels: low_latency is one_shot there.
	hh := planHandle(nil)
	c, err = hh.plan(CollArgs{Kind: core.AllReduce, DType: core.Float32, Count: 64, Algo: core.AlgoLowLatency})
	require.NoError(t, err)
	require.Equal(t, core.AlgoOneShot, c.Algo)
	require.Zero(t, c.LLSlot)
}
