package coll

import (
	"strings"
	"testing"
	"time"

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

// planTarget is a handle of one machine as plan sees it: rank 1 of 2 on
// be, every block and pad at made-up addresses that nothing reads (plan
// reads the description only, never the port).
func planTarget(be core.Backend) *target {
	return &target{SymmetricBuffer: core.SymmetricBuffer{GroupName: "ll", Rank: 1, World: 2, Timeout: time.Second,
		BufferSize: 8 << 20, SignalPadSize: 64 << 10,
		Buffers: []uintptr{0x100000, 0x200000}, SignalPads: []uintptr{0x9000000, 0xa000000},
		BufferArray: 0x7000000, PadArray: 0x7000010, Backend: be, Attached: &core.Attachment{}}}
}

// Note [Low-latency collectives]: auto takes the low-latency path for what
// fits the buffers on a backend that launches kernels, an explicit
// low_latency that cannot run says why, and the host backend runs it as
// one_shot.
func TestLowLatencyPlan(t *testing.T) {
	h := planTarget(&kernelBackend{})
	c, err := plan(h, Args{Kind: core.AllReduce, DType: core.BFloat16, Count: 2048})
	require.NoError(t, err)
	require.Equal(t, core.AlgoLowLatency, c.Algo)
	require.Equal(t, uint32(core.KernelLowLatency), c.KernelAlgo())
	require.Equal(t, core.LowLatencyOffset(64<<10, 2), c.LLOffset)
	require.Equal(t, 2*core.LowLatencyMaxBytes, c.LLSlot)
	require.Equal(t, h.SignalPads, c.PadAddrs)
	require.Equal(t, uint64(core.KernelLowLatency), argsWord(c)>>59&7, "the digest covers the path")
	require.Contains(t, argsText(argsWord(c)), "low_latency")
	require.Zero(t, core.LowLatencyOffset(64<<10, 2)%256)
	require.GreaterOrEqual(t, core.LowLatencyOffset(64<<10, 2), 64<<10+core.DeviceRegionBytes(2))

	// Past the buffers: the barrier kernels.
	c, err = plan(h, Args{Kind: core.AllReduce, DType: core.BFloat16, Count: (core.LowLatencyMaxBytes + 2) / 2})
	require.NoError(t, err)
	require.NotEqual(t, core.AlgoLowLatency, c.Algo)
	// An explicit one_shot stays one_shot.
	c, err = plan(h, Args{Kind: core.AllReduce, DType: core.BFloat16, Count: 2048, Algo: core.AlgoOneShot})
	require.NoError(t, err)
	require.Equal(t, core.AlgoOneShot, c.Algo)
	// all_gather and reduce_scatter: a multiple of 8 bytes per rank and peer.
	c, err = plan(h, Args{Kind: core.AllGather, DType: core.Float32, Count: 64, Out: 0x300000})
	require.NoError(t, err)
	require.Equal(t, core.AlgoLowLatency, c.Algo)
	c, err = plan(h, Args{Kind: core.ReduceScatter, DType: core.BFloat16, Count: 6, Out: 0x300000})
	require.NoError(t, err)
	require.Equal(t, core.AlgoOneShot, c.Algo, "3 bf16 per peer: 6 bytes")

	for _, tc := range []struct {
		args Args
		why  string
	}{
		{Args{Kind: core.AllReduce, DType: core.Float32, Count: 64, Algo: core.AlgoLowLatency, Channel: 1}, "only collective channel 0"},
		{Args{Kind: core.AllReduce, DType: core.Float32, Count: core.LowLatencyMaxBytes, Algo: core.AlgoLowLatency}, "SYMMEM_LL_MAX_BYTES"},
		{Args{Kind: core.ReduceScatter, DType: core.Float32, Count: 2, Out: 0x300000, Algo: core.AlgoLowLatency}, "not a multiple of 8"},
	} {
		_, err := plan(h, tc.args)
		require.Error(t, err)
		require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err))
		require.True(t, strings.Contains(err.Error(), tc.why), err.Error())
	}

	// Past LowLatencyMaxWorld ranks: no buffers, the barrier kernels.
	big := planTarget(&kernelBackend{})
	big.World = core.LowLatencyMaxWorld + 1
	big.Buffers, big.SignalPads = make([]uintptr, big.World), make([]uintptr, big.World)
	big.Buffers[1] = 0x100000
	c, err = plan(big, Args{Kind: core.AllReduce, DType: core.Float32, Count: 64})
	require.NoError(t, err)
	require.NotEqual(t, core.AlgoLowLatency, c.Algo)
	require.Zero(t, core.LowLatencyAreaBytes(big.World))

	// A backend that runs no kernels: low_latency is one_shot there.
	hh := planTarget(nil)
	c, err = plan(hh, Args{Kind: core.AllReduce, DType: core.Float32, Count: 64, Algo: core.AlgoLowLatency})
	require.NoError(t, err)
	require.Equal(t, core.AlgoOneShot, c.Algo)
	require.Zero(t, c.LLSlot)
}
