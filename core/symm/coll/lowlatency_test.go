package coll

import (
	"strings"
	"sync"
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

// planView is a handle of one machine as plan sees it: rank 1 of 2 on be,
// every block and pad at made-up addresses that nothing reads.
type planView struct {
	be         core.Backend
	world      int
	bufs, pads []uintptr
	locks      [core.CollChannels]sync.Mutex
}

func newPlanView(be core.Backend) *planView {
	return &planView{be: be, world: 2, bufs: []uintptr{0x100000, 0x200000}, pads: []uintptr{0x9000000, 0xa000000}}
}

func (v *planView) Enter() (func(), error)                               { return func() {}, nil }
func (v *planView) Stopped() error                                       { return nil }
func (v *planView) StopMirror() uintptr                                  { return 0 }
func (v *planView) GroupName() string                                    { return "ll" }
func (v *planView) Rank() int                                            { return 1 }
func (v *planView) World() int                                           { return v.world }
func (v *planView) Timeout() time.Duration                               { return time.Second }
func (v *planView) BufferSize() uintptr                                  { return 8 << 20 }
func (v *planView) Offset() uintptr                                      { return 0 }
func (v *planView) SignalPadSize() uintptr                               { return 64 << 10 }
func (v *planView) Buffers() []uintptr                                   { return v.bufs }
func (v *planView) SignalPads() []uintptr                                { return v.pads }
func (v *planView) PointerArrays() (uintptr, uintptr)                    { return 0x7000000, 0x7000010 }
func (v *planView) Backend() (core.Backend, int)                         { return v.be, 0 }
func (v *planView) ChannelLock(channel int) *sync.Mutex                  { return &v.locks[channel] }
func (v *planView) WaitCut(uint64, string) error                         { return nil }
func (v *planView) PeerExited(int, time.Time, *time.Time, string) error  { return nil }
func (v *planView) Team() ([]int, uintptr, uintptr)                      { return nil, 0, 0 }
func (v *planView) TeamSizes() (bool, string)                            { return true, "2" }
func (v *planView) Engine() core.Communicator                            { return nil }
func (v *planView) SplitByLocalRank() (core.Communicator, func(), error) { return nil, nil, nil }
func (v *planView) SplitClosed() bool                                    { return false }
func (v *planView) EngineErr(what string, err error) error               { return err }
func (v *planView) NoEngine(what string) error                           { return nil }
func (v *planView) Staging(uintptr) (uintptr, uintptr, func(error), error) {
	return 0, 0, nil, core.Errorf(core.ErrUnavailable, "no staging")
}

// Note [Low-latency collectives]: auto takes the low-latency path for what
// fits the buffers on a backend that launches kernels, an explicit
// low_latency that cannot run says why, and the host backend runs it as
// one_shot.
func TestLowLatencyPlan(t *testing.T) {
	h := newPlanView(&kernelBackend{})
	c, err := plan(h, Args{Kind: core.AllReduce, DType: core.BFloat16, Count: 2048})
	require.NoError(t, err)
	require.Equal(t, core.AlgoLowLatency, c.Algo)
	require.Equal(t, uint32(core.KernelLowLatency), c.KernelAlgo())
	require.Equal(t, core.LowLatencyOffset(64<<10, 2), c.LLOffset)
	require.Equal(t, 2*core.LowLatencyMaxBytes, c.LLSlot)
	require.Equal(t, h.pads, c.PadAddrs)
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
	big := newPlanView(&kernelBackend{})
	big.world = core.LowLatencyMaxWorld + 1
	big.bufs, big.pads = make([]uintptr, big.world), make([]uintptr, big.world)
	big.bufs[1] = 0x100000
	c, err = plan(big, Args{Kind: core.AllReduce, DType: core.Float32, Count: 64})
	require.NoError(t, err)
	require.NotEqual(t, core.AlgoLowLatency, c.Algo)
	require.Zero(t, core.LowLatencyAreaBytes(big.world))

	// A backend that runs no kernels: low_latency is one_shot there.
	hh := newPlanView(nil)
	c, err = plan(hh, Args{Kind: core.AllReduce, DType: core.Float32, Count: 64, Algo: core.AlgoLowLatency})
	require.NoError(t, err)
	require.Equal(t, core.AlgoOneShot, c.Algo)
	require.Zero(t, c.LLSlot)
}
