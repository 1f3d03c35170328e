package coll

import (
	"fmt"

	"github.com/libsymmem/libsymmem/core"
)

// Note [Low-latency collectives]
//
// Under CUDA-graph replay a small collective costs a kernel's launch plus
// its crossings of NVLink, and a barrier is a round trip: the barrier
// kernels (open barrier, loads, closing barrier) cross three times and
// measured 6.8 us for an all-reduce of 4 KiB on 2 x H200. The low-latency
// path crosses once: each rank stores what each peer needs (all_reduce:
// its input; reduce_scatter: the peer's slice; all_gather: its input) into
// that peer's buffer as 16-byte lines {4 data bytes, flag, 4 data bytes,
// flag}, the flag being the channel's call count + 1, and polls its own
// buffer until every line of the call carries the call's flag (each
// 8-byte half is one store, so data and flag arrive together). Nobody reads
// a peer's input or writes a peer's output, so in place and out of place
// are the same call and need no barrier. Two parities of buffers keep a
// sender from overwriting lines not yet read (a sender is at most one call
// ahead of its receivers); the call count lives in the pad (word 4 of the
// region) and the kernel advances it, so CUDA-graph replays go on
// counting. The argument agreement rides along: each rank publishes its
// digest to each peer before its data and checks the peers' before it
// writes any output (Note [Collective agreement]), and every poll gives up
// on the abort word or the timeout as the barriers do. Cost: twice the
// bytes on the wire (half of each line is flags) and W-1 stores of each
// byte, so it pays for small calls: auto takes it whenever the data per
// rank and peer fits core.LowLatencyMaxBytes (SYMMEM_LL_MAX_BYTES), which
// is also what sizes the buffers: 2 * world * 2 * LowLatencyMaxBytes bytes
// of each rank's pad, channel 0 only (other channels run the barrier
// kernels), in groups of at most core.LowLatencyMaxWorld ranks (Note [Pad
// partition] in core says where they lie). all_gather and reduce_scatter
// need a multiple of 8 bytes per rank and peer. The crossover was measured
// with bench/coll_bench.py (README, "Collectives").

// collUnchecked turns the argument agreement off, for measuring its cost
// only (SYMMEM_COLL_UNCHECKED).
var collUnchecked = core.Current().Bool("SYMMEM_COLL_UNCHECKED", false)

// launchesKernels says whether the group's backend runs collectives as
// kernels (the low-latency buffers exist only there).
func launchesKernels(h *target) bool {
	_, ok := h.Backend.(core.CollectiveLauncher)
	return ok
}

// lowLatencyFits says whether a can run on the low-latency path of a
// kernel backend (Note [Low-latency collectives]), or why not.
func lowLatencyFits(h *target, a Args, inBytes uintptr) (bool, string) {
	world := h.World
	w := uintptr(world)
	per := inBytes // bytes each rank sends each peer
	if a.Kind == core.ReduceScatter {
		per = inBytes / w
	}
	switch {
	case !launchesKernels(h):
		return false, "the backend runs no kernels"
	case a.Channel != 0:
		return false, fmt.Sprintf("only collective channel 0 has low-latency buffers (channel %d)", a.Channel)
	case core.LowLatencyMaxBytes == 0:
		return false, "SYMMEM_LL_MAX_BYTES is 0"
	case world > core.LowLatencyMaxWorld:
		return false, fmt.Sprintf("groups of more than %d ranks have no low-latency buffers (%d ranks)", core.LowLatencyMaxWorld, world)
	case per > core.LowLatencyMaxBytes:
		return false, fmt.Sprintf("%d bytes per rank and peer are past SYMMEM_LL_MAX_BYTES (%d)", per, core.LowLatencyMaxBytes)
	case a.Kind != core.AllReduce && per%8 != 0:
		return false, fmt.Sprintf("%d bytes per rank and peer are not a multiple of 8", per)
	}
	return true, ""
}
