package core

// Note [Pad partition]
//
// A rank's signal pad is signal_pad_size bytes of 32-bit slots that belong
// to host-side signals and to users' own protocols (slot channel*world +
// sender, Note [Signals] in core/symm), followed by the library's device
// region of DeviceRegionBytes(world) bytes, which no channel reaches: the
// pad's memory is made that much larger (and rounded up to the
// granularity), so the two never collide whatever channels users pick.
// core/symm makes the pads by this layout; the collectives
// (core/symm/coll), the signals' kernel and the kernels of cuda use it.
// include/symmem_device.cuh states the same layout (SYMMEM_DEV_*;
// TestDeviceHeaderConstants checks that both agree). In 32-bit words from
// the region's start:
//
//	word 0                  the error flag: 0, or the first failure of a
//	                        kernel: 0x80000000 | cause<<29 | peer<<16 | set,
//	                        cause 0 a wait timed out, 1 the peer's
//	                        collective arguments differ (Note [Collective
//	                        agreement] in core/symm/coll), 2 the peer's
//	                        process exited, 3 with DevOverrunSetBit in
//	                        the set an all-to-all's refusal for the
//	                        peer's splits or out (3 without it: a wait
//	                        that gave up because a peer's had, as the
//	                        stop word below holds it)
//	word 1                  the abort word: 0, or 0x80000000 | 2<<29 |
//	                        peer<<16 written by the host when it sees
//	                        rank peer's process exit (Note [Dead peers] in
//	                        core/ipc); waiting kernels give up when they
//	                        see it
//	word 2                  the buffer of the all-reduce that is a barrier
//	                        across machines (Note [Collectives across
//	                        machines] in core/symm; its value means nothing)
//	word 3                  the stop word: 0, or why the group's
//	                        collectives stopped (Note [Failed
//	                        collectives] in core/symm/coll): the flag of
//	                        this rank's wait that gave up, as word 0
//	                        holds it (the abort and the cut waits of the
//	                        host backend as cause 2 with this rank as the
//	                        peer), or 0x80000000 | 3<<29 | r<<16 |
//	                        cause<<12 | set written by rank r when a wait
//	                        of its own gave up for cause at set (DevGaveUp)
//	word 4                  the low-latency path's call count (its
//	                        sequence number, Note [Low-latency collectives]
//	                        in core/symm/coll)
//	word 5                  how many blocks of the current low-latency call
//	                        have finished (the last one advances word 4)
//	word 6                  the all-to-all's call count (Note [All-to-all]
//	                        in core/symm/coll/alltoall.go)
//	word 7                  how many blocks of the current all-to-all have
//	                        finished (the last one advances word 6)
//	words 8..15             reserved (zero)
//	set s, s in [0, 512)    2*world words at 16 + s*2*world:
//	                        arrivals[w]: how many times rank w has arrived at
//	                                     this set's barrier in our pad (only w
//	                                     adds to it, atomically, with release)
//	                        seen[w]:     how many of those we have consumed
//	                                     (only we write it); seen[rank] is the
//	                                     set's grid-barrier counter instead
//
// Sets [0, 256) are the library's: collective channel c (in
// [0, CollChannels)), kernel block b (in [0, CollMaxBlocks)) uses set
// c*CollMaxBlocks + b. Sets [256, 512) are users' device barriers
// (symmem_dev_barrier_* of the device header take a set in [0, 256)).
//
// On a group that spans machines the library's sets and argument slots are
// laid out for the local team, with world = its size (Note [Team view] in
// core/symm/coll).
//
// After the sets, at the first 8-byte aligned address, the argument slots
// of the library's sets: for set s in [0, 256) and sender w, 16 bytes at
// 16*(s*world + w): a 64-bit word arrival<<32 | digest (what rank w
// published with its arrival number at set s's opening barrier of a
// collective), then a 64-bit word of the packed arguments (on the host
// backend; kernels use the two words by the parity of the arrival instead,
// Note [Collective agreement]).
//
// Then, at the region's end rounded up to 256 bytes (A2AExchangeOffset),
// the all-to-all's exchange area: for parity 0 and 1, A2AMaxSplits entries
// of two 64-bit words, where the peers store the splits this rank receives
// from them and their row offsets in the senders' inputs (Note
// [All-to-all] in core/symm/coll).
//
// Then, at CopyEngineFlagsOffset (the exchange area's end), the copy-engine
// collectives' flags (Note [Copy-engine collectives] in core/symm/coll):
// for collective channel c, barrier phase ph (0 opening, 1 middle, 2
// closing) and sender w, one 32-bit word at 4*((c*3+ph)*world + w): 0, or
// what w stored there for its arrival; only w sets it, only this rank
// clears it (both with stream memory operations, no kernel).
//
// On backends that launch kernels the pad holds one more area, the
// low-latency buffers of collective channel 0, at LowLatencyOffset (the
// copy-engine flags' end): for parity 0 and 1 and sender w, a
// slot of LowLatencySlotBytes at (parity*world + w)*LowLatencySlotBytes
// (Note [Low-latency collectives]). It is zero when the pad is made, as the
// rest.
//
// A barrier on set s: add 1 to arrivals[me] of s in every peer's region,
// then for each peer p wait until arrivals[p] in ours has reached seen[p]+1
// (compared as int32(count-expected) >= 0, so wrap-around is harmless) and
// store seen[p]+1. Nothing needs resetting: the counts only grow, a barrier
// is balanced on every rank, so the next use (the next call, the next replay
// of a CUDA graph) finds the pads ready. A wait is bounded by the group's
// timeout: a kernel that gives up records the error flag and returns (its
// results are then undefined); the host backend returns ErrTimeout.
const (
	// DeviceRegionHeaderWords is the number of header words of the region.
	DeviceRegionHeaderWords = 16
	// DeviceSets is the number of barrier sets of the region.
	DeviceSets = 512
	// CollChannels is the number of collective channels: collectives that
	// may run at once on one group (on different streams) need different
	// channels.
	CollChannels = 4
	// CollMaxBlocks is the most kernel blocks of one collective.
	CollMaxBlocks = 64
	// LibrarySets is the number of the library's sets.
	LibrarySets = CollChannels * CollMaxBlocks
)

// DeviceRegionBytes is the size of the library's region of a pad for world
// ranks: the words, up to 4 bytes of alignment, the argument slots.
func DeviceRegionBytes(world int) uintptr {
	return uintptr(4*(DeviceRegionHeaderWords+DeviceSets*2*world) + 8 + 16*LibrarySets*world)
}

// Causes of the error flag (word 0 of the region).
const (
	DevFlagFailed      = 0x80000000
	DevCauseTimeout    = 0
	DevCauseMismatch   = 1
	DevCausePeerExited = 2
)

// DevStopWord is the index of the stop word in the region, and
// DevCauseGaveUp the cause of a stop word that a peer wrote (Note [Pad
// partition]).
const (
	DevStopWord    = 3
	DevCauseGaveUp = 3
)

// DevOverrunSetBit marks, in the set field of an error flag of cause
// DevCauseGaveUp, an all-to-all's refusal rather than a stop: the peer
// field names the rank whose splits were bad, or the receiver whose out
// they would pass (Note [All-to-all] in core/symm/coll).
const DevOverrunSetBit = 0x8000

// IsDevOverrun says whether error flag v records an all-to-all's refusal.
func IsDevOverrun(v uint32) bool {
	return v&DevFlagFailed != 0 && v>>29&3 == DevCauseGaveUp && v&DevOverrunSetBit != 0
}

// DevGaveUp is the stop word that rank writes into every peer's region when
// a wait of its own gave up for cause at set.
func DevGaveUp(rank, cause, set int) uint32 {
	return DevFlag(DevCauseGaveUp, rank, (cause&3)<<12|set&0xfff)
}

// DevFlag is the error flag word of a wait that gave up for cause on peer
// at set.
func DevFlag(cause, peer, set int) uint32 {
	return DevFlagFailed | uint32(cause)<<29 | uint32(peer&0x1fff)<<16 | uint32(set&0xffff)
}

// LowLatencyMaxBytes is the most data per rank and peer of a low-latency
// call, and what sizes the buffers (Note [Low-latency collectives] in
// core/symm/coll); SYMMEM_LL_MAX_BYTES overrides it (a multiple of 8; the
// same on every rank, as the pads' size depends on it; 0 turns the path
// off).
var LowLatencyMaxBytes = uintptr(Current().Size("SYMMEM_LL_MAX_BYTES", 256<<10)) &^ 7

// LowLatencyMaxWorld is the largest group with low-latency buffers: they
// take 4 * world * LowLatencyMaxBytes of each rank's pad (16 MiB at 16
// ranks), and past a node's GPUs a call's W-1 stores of each byte outweigh
// the barrier they save.
const LowLatencyMaxWorld = 16

// LowLatencySlotBytes is one sender's slot of low-latency lines: two bytes
// of line per byte of data.
func LowLatencySlotBytes() uintptr { return 2 * LowLatencyMaxBytes }

// A2AExchangeOffset is where the all-to-all's exchange area starts in a
// pad of padSize bytes for world ranks, and A2AExchangeBytes its size.
func A2AExchangeOffset(padSize uintptr, world int) uintptr {
	const align = 256
	return (padSize + DeviceRegionBytes(world) + align - 1) / align * align
}

// A2AExchangeBytes is the size of the exchange area: two parities of
// A2AMaxSplits entries of 16 bytes.
const A2AExchangeBytes = 2 * A2AMaxSplits * 16

// CopyEngineFlagsOffset is where the copy-engine collectives' flags start
// in a pad of padSize bytes for world ranks.
func CopyEngineFlagsOffset(padSize uintptr, world int) uintptr {
	return A2AExchangeOffset(padSize, world) + A2AExchangeBytes
}

// CopyEnginePhases is the number of barrier phases of a copy-engine
// collective that have flags of their own: opening, middle, closing.
const CopyEnginePhases = 3

// CopyEngineFlagsBytes is the size of the copy-engine flags for world
// ranks, rounded up to 256 bytes.
func CopyEngineFlagsBytes(world int) uintptr {
	return (uintptr(4*CollChannels*CopyEnginePhases*world) + 255) &^ 255
}

// CopyEngineFlag is the offset in a pad (padSize, world) of the flag of
// channel, phase and sender.
func CopyEngineFlag(padSize uintptr, world, channel, phase, sender int) uintptr {
	return CopyEngineFlagsOffset(padSize, world) + uintptr(4*((channel*CopyEnginePhases+phase)*world+sender))
}

// PadEnd is the end of the library's part of a pad of padSize bytes for
// world ranks without the low-latency buffers: the region, the exchange
// area and the copy-engine flags.
func PadEnd(padSize uintptr, world int) uintptr {
	return CopyEngineFlagsOffset(padSize, world) + CopyEngineFlagsBytes(world)
}

// LowLatencyOffset is where the low-latency buffers start in a pad of
// padSize bytes for world ranks.
func LowLatencyOffset(padSize uintptr, world int) uintptr {
	return PadEnd(padSize, world)
}

// LowLatencyAreaBytes is the size of the low-latency buffers for world
// ranks: none past LowLatencyMaxWorld.
func LowLatencyAreaBytes(world int) uintptr {
	if world > LowLatencyMaxWorld {
		return 0
	}
	return 2 * uintptr(world) * LowLatencySlotBytes()
}
