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

// Note [Inputs outside the block]
//
// The low-latency path reads a rank's input on that rank only: the rank
// stores its own lines into its peers' buffers, and nobody reads a peer's
// block. So its input may lie anywhere in the rank's device memory, not
// only at the rendezvous pointer: a tensor that torch allocated (x * 2, the
// copy that functionalization makes under torch.compile) all-reduces with
// no copy into a symmetric workspace (Note [Staging] in python/symmem/
// torch.py). Args.In (symmem_collective_from) names such an input. The
// handle then serves for its group's pads only; its block is neither read
// nor written. plan runs such a call on the low-latency path (on a group of
// one rank, the one-shot kernel, which reads its own input only) and
// refuses, naming why, what cannot run there: an explicit algo other than
// low_latency, a call past the buffers, a group across machines, a backend
// without kernels (the host backend's runner reads its peers' blocks). The
// kernels find their input at their own block + in_offset, so plan sets
// InOffset to In - block (modulo 2^64), which lands on In; nothing else
// changes, and the argument agreement is the same call's (the digest holds
// the path, not the input's place). LowLatencyBytes tells a caller in
// advance what fits, so that it stages only what must be staged.

// LowLatencyBytes is the most bytes per rank and peer that a call on the
// group behind p runs on the low-latency path, and so the most an input
// outside the block may hold per peer (Note [Inputs outside the block]):
// an all-reduce's or all-gather's input, a reduce-scatter's input / world;
// all-gathers and reduce-scatters also need a multiple of 8 bytes per
// peer. 0 where the group has no such path: a backend without kernels, a
// group across machines, more than core.LowLatencyMaxWorld ranks,
// SYMMEM_LL_MAX_BYTES 0.
func LowLatencyBytes(p Port) uintptr {
	h := target{p.Symmetric(), p}
	if !launchesKernels(&h) || h.team() != nil || h.World > core.LowLatencyMaxWorld {
		return 0
	}
	return core.LowLatencyMaxBytes
}

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
