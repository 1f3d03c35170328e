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

// Note [Inputs outside the block]: an input anywhere in the rank's memory
// runs on the low-latency path, the kernel's own block + InOffset landing
// on it; what cannot run there is refused with the reason, and nothing is
// launched.
func TestInputOutsideTheBlock(t *testing.T) {
	kb := &kernelBackend{}
	h := planTarget(kb)
	base := h.Buffers[h.Rank]
	for _, in := range []uintptr{0x5000000, 0x10000} { // above and below the block
		c, err := plan(h, Args{Kind: core.AllReduce, DType: core.BFloat16, Count: 2048, In: in})
		require.NoError(t, err)
		require.Equal(t, core.AlgoLowLatency, c.Algo)
		require.Equal(t, in, base+c.InOffset, "the kernel's block + in_offset is the input")
		require.Equal(t, in, c.Out, "out NULL: in place at the input")
		require.Less(t, c.OutOffset, int64(0), "out is outside the block")

		c, err = plan(h, Args{Kind: core.AllGather, DType: core.Float32, Count: 64, In: in, Out: 0x6000000})
		require.NoError(t, err)
		require.Equal(t, core.AlgoLowLatency, c.Algo)
		require.Equal(t, in, base+c.InOffset)
		c, err = plan(h, Args{Kind: core.ReduceScatter, DType: core.BFloat16, Count: 64, In: in, Out: 0x6000000, Algo: core.AlgoLowLatency})
		require.NoError(t, err)
		require.Equal(t, core.AlgoLowLatency, c.Algo)
	}
	// The same call from the block and from outside it agree (same digest).
	inside, err := plan(h, Args{Kind: core.AllReduce, DType: core.BFloat16, Count: 2048, Out: 0x6000000})
	require.NoError(t, err)
	outside, err := plan(h, Args{Kind: core.AllReduce, DType: core.BFloat16, Count: 2048, In: 0x5000000, Out: 0x6000000})
	require.NoError(t, err)
	require.Equal(t, inside.Digest, outside.Digest)
	// In at the rendezvous pointer is the ordinary call.
	c, err := plan(h, Args{Kind: core.AllReduce, DType: core.BFloat16, Count: 1 << 20, In: base + h.Offset, Algo: core.AlgoOneShot})
	require.NoError(t, err)
	require.Equal(t, core.AlgoOneShot, c.Algo)
	require.Equal(t, h.Offset, c.InOffset)

	ll := core.LowLatencyMaxBytes
	for _, tc := range []struct {
		h    *target
		args Args
		why  string
	}{
		{h, Args{Kind: core.AllReduce, DType: core.BFloat16, Count: 2048, In: 0x5000000, Algo: core.AlgoOneShot}, "one_shot reads the peers' inputs"},
		{h, Args{Kind: core.AllReduce, DType: core.BFloat16, Count: 2048, In: 0x5000000, Algo: core.AlgoCopyEngine}, "copy_engine reads the peers' inputs"},
		{h, Args{Kind: core.AllReduce, DType: core.Float32, Count: ll/4 + 1, In: 0x5000000}, "cannot run this call"},
		{h, Args{Kind: core.AllReduce, DType: core.Float32, Count: 1 << 60, In: 0x5000000}, "past its buffers"},
		{h, Args{Kind: core.AllReduce, DType: core.Float32, Count: 64, In: 0x5000000, Channel: 1}, "only collective channel 0"},
		{h, Args{Kind: core.AllGather, DType: core.BFloat16, Count: 3, In: 0x5000000, Out: 0x6000000}, "not a multiple of 8"},
		{h, Args{Kind: core.AllReduce, DType: core.Float32, Count: 64, In: 0x5000008}, "16-byte aligned"},
		{planTarget(nil), Args{Kind: core.AllReduce, DType: core.Float32, Count: 64, In: 0x5000000}, "the backend runs no kernels"},
		{spanTarget(kb), Args{Kind: core.AllReduce, DType: core.Float32, Count: 64, In: 0x5000000}, "spans machines"},
	} {
		_, err := plan(tc.h, tc.args)
		require.Error(t, err, tc.why)
		require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err))
		require.Contains(t, err.Error(), tc.why)
	}
	err = runEntered(h, Args{Kind: core.AllToAll, DType: core.Float32, Count: 64, In: 0x5000000, Out: 0x6000000})
	require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err))
	require.Contains(t, err.Error(), "in must be NULL")
	require.Empty(t, kb.launched, "nothing refused was launched")

	// One rank: the one-shot kernel, which reads its own input only.
	one := planTarget(kb)
	one.Rank, one.World, one.Buffers, one.SignalPads = 0, 1, one.Buffers[:1], one.SignalPads[:1]
	c, err = plan(one, Args{Kind: core.AllReduce, DType: core.Float32, Count: 64, In: 0x5000000})
	require.NoError(t, err)
	require.Equal(t, core.AlgoOneShot, c.Algo)
	require.Equal(t, uintptr(0x5000000), one.Buffers[0]+c.InOffset)
}

// spanTarget is planTarget on a group that spans machines.
func spanTarget(be core.Backend) *target {
	h := planTarget(be)
	h.Span = &core.MachineSpan{GroupName: h.GroupName, Rank: h.Rank, Team: []int{1}, Machines: 2}
	return h
}

// The all-reduce with RMSNorm takes an input outside the block on its fused
// low-latency call only (Note [Inputs outside the block]).
func TestNormInputOutsideTheBlock(t *testing.T) {
	kb := &kernelBackend{}
	h := planTarget(kb)
	base := h.Buffers[h.Rank]
	na := NormArgs{DType: core.BFloat16, Tokens: 2, Hidden: 4096, Residual: 0x8000000, Weight: 0x9000000, Out: 0xa000000,
		Eps: 1e-6, In: 0x5000000}
	c, ar, err := planNorm(h, na)
	require.NoError(t, err)
	require.Equal(t, core.AlgoLowLatency, c.Algo)
	require.NotNil(t, c.Norm)
	require.Equal(t, na.In, base+c.InOffset)
	require.Equal(t, core.AllReduce, ar.Kind)
	inside := na
	inside.In = 0
	ci, _, err := planNorm(h, inside)
	require.NoError(t, err)
	require.Equal(t, ci.Digest, c.Digest, "the same call from the block or outside it agrees")

	one := planTarget(kb)
	one.Rank, one.World, one.Buffers, one.SignalPads = 0, 1, one.Buffers[:1], one.SignalPads[:1]
	big := na
	big.Tokens = core.LowLatencyMaxBytes/(2*4096) + 1
	oneShot := na
	oneShot.Algo = core.AlgoOneShot
	for _, tc := range []struct {
		h   *target
		a   NormArgs
		why string
	}{
		{h, big, "past its buffers"},
		{h, oneShot, "runs the all-reduce apart"},
		{one, na, "a group of one rank"},
		{planTarget(nil), na, "runs no kernels"},
		{spanTarget(kb), na, "spans machines"},
	} {
		_, _, err := planNorm(tc.h, tc.a)
		require.Error(t, err, tc.why)
		require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err))
		require.Contains(t, err.Error(), "outside the rendezvoused block")
		require.Contains(t, err.Error(), tc.why)
	}
	require.Empty(t, kb.launched)
}
