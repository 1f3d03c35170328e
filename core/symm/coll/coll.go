// Package coll is the collectives over symmetric memory: all-reduce,
// all-gather and reduce-scatter on a rendezvoused buffer. It checks and
// plans a call (which algorithm, the arguments every rank must agree on),
// runs it on this machine with the library's own machinery (kernels on the
// backend, or the host reference runner over CPU memory), and on a group
// that spans machines through the group's engine or hierarchically over
// the local team. It sees a handle only through its description
// (core.SymmetricBuffer) and its Port (core/symm's Handle implements
// both), and the pads' layout through core (Note [Pad partition]).
package coll

import (
	"fmt"
	"math"

	"github.com/libsymmem/libsymmem/core"
)

// Note [Collectives]
//
// all_reduce, all_gather and reduce_scatter read every rank's input in the
// rendezvoused block: count elements at the handle's offset. Every rank
// calls with the same arguments (out may differ unless two-shot, which
// writes or reads the peers' outs, runs). What each writes, with W ranks and rank r:
//
//	all_reduce      count elements to out (default: in place), the
//	                reduction in rank order 0..W-1, in fp32 for bf16/fp16
//	                (rounded once, to nearest even), int32 wrapping.
//	all_gather      W*count elements to out, rank p's at p*count; in place
//	                when out + r*count elements is the input.
//	reduce_scatter  count/W elements (count a multiple of W): the reduction
//	                of slice r; in place when out is slice r of the input.
//
// Every collective is: a barrier (the inputs are ready), the work, a barrier
// (nobody overwrites memory a peer is reading; stores into peers are
// done). One-shot all-reduce reads every rank's whole input; two-shot
// reduces slice r (slices of ceil(count/W) elements rounded up to 16 bytes)
// and stores it into every rank's out, or for large calls into its own out
// and then reads every peer's reduced slice from the peer's out (Note
// [Two-shot pulls]), so it needs out inside the block (at the same offset
// everywhere: in place or another part of the block); auto picks by world
// size, size and placement (Note [All-reduce choice]).
// Pointers must be 16-byte aligned (the kernels load and store 16 bytes);
// counts need not be a multiple of anything.

// Note [Two-shot pulls]
//
// Two-shot's second phase has two forms. Push: rank r stores its reduced
// slice into every rank's out, and a publishing closing barrier makes the
// stores visible. Pull: rank r stores its reduced slice into its own out, a
// block barrier publishes it (release at system scope), and rank r then
// reads slice q from rank q's out for every peer q: nothing crosses NVLink
// but loads, as in one-shot, for the same bytes ((W-1)*n/W in each phase).
// Measured in place on 2 x H200 (bf16, bench/coll_bench.py, each against
// torch's two_shot_all_reduce_ in the same run): push 1.002 / 1.004 / 1.015
// x torch at 16 / 64 / 256 MiB, pull 0.989 / 0.998 / 0.993 x; but at 4 MiB
// push 0.92 x and pull 1.02 x, and at 1 MiB pull 1.06 x (its extra barrier
// and the serial second phase weigh there). So two-shot pulls from
// TwoShotPullMinBytes (8 MiB, between the measured 4 and 16) and pushes
// below. Why no store races a read in a pull: in phase 1 rank r writes
// only slice r of its own out and reads only slice r of every input, which
// no other rank writes; in phase 2 it writes the other slices of its own
// out, which its peers read only in phase 1 (in place, out is the input),
// before the middle barrier. The kernels' middle and closing barriers are
// per block (block b with the peers' block b): phase 2 reads each item
// with the thread of the same index that reduced it on the slice's owner
// (symmem_pull_slice), so block b reads only what the peers' block b
// wrote before the barrier they shared. The host backend runs the same
// barriers and makes the same choice.

// Note [All-reduce choice]
//
// Bytes over NVLink per rank for an all-reduce of n bytes on W ranks:
// one-shot reads (W-1)*n from the peers; two-shot reads (W-1)*n/W (its
// slice of every peer's input) and moves (W-1)*n/W more (the reduced
// slices, stored into the peers or read from them: Note [Two-shot pulls]),
// 2*(W-1)*n/W in all. At W = 2 both move n bytes per rank; one-shot does
// it in one kernel phase, and measured faster at every size out of place
// on 2 x H200 (bench/coll_bench.py, 2026-11-22: 64 MiB 208.5 us against
// two-shot's 216.3, 256 MiB 806.7 against 838.5; with the pull, 805.6
// against 810.3), so auto is one-shot at W = 2, except in
// place above OneShotMaxBytes: in place, a rank may store only what every
// peer has read, so the one-shot kernel reads, meets its peers and stores
// in rounds of one barrier each (Note [Collectives]), which costs a barrier
// per round at large sizes; two-shot (in place by construction, one
// closing barrier) runs those. How far in-place one-shot pays at W = 2 was
// measured (three runs on 2 x H200, 2026-11-23): at 1 MiB it
// took 10.46 / 9.56 / 9.43 us against two-shot's 12.54 / 10.29 / 10.12
// (torch's two-shot 11.21 / 10.23 / 10.17), at 4 MiB 23.86 against 18.92:
// so in place at W = 2 it runs up to OneShotInPlaceMaxBytes2 (1 MiB).
// From W = 3 on one-shot reads (W-1)*n against two-shot's 2*(W-1)*n/W <=
// 4/3*n: one-shot only for small messages (latency: one phase), two-shot
// above OneShotMaxBytes.

// Note [Collective agreement]
//
// Ranks that pass different arguments to one collective would read and
// write past each other (different counts, element types, reductions or
// phase counts), so every rank compares every peer's arguments with its
// own before any data moves, with no host round trip: at the opening
// barrier of a call (block b's set on the GPU, the channel's first set on
// the host), each rank stores into each peer p's argument slot (set, me)
// the word arrival<<32 | digest, where arrival is the number of the arrival
// it is about to make at p (seen[p]+1 of its own region: barriers are
// balanced, so that is also the count p waits for) and digest a 32-bit hash
// of the packed arguments (argsWord: kind, dtype, op, resolved algorithm,
// count; op is 0 for all_gather, which has none), then arrives. After its
// wait for p, a rank reads the slot (set, p) of its own region until its
// arrival half is the one it waited for (the slot and the arrival are
// separate stores, which a kernel does not order without a system-scope
// fence; the tag makes a stale slot visible instead), and compares digests.
// A difference fails the call on every rank before the work (if not all
// ranks agree, each rank differs from at least one peer): the host backend
// returns ErrMismatch naming every rank's arguments (it also stores the
// packed arguments in the slot's second word, its atomics order both
// stores before the arrival, and one more barrier keeps the slots until
// every rank has read them); a kernel records core.DevCauseMismatch with the
// peer in the error flag and returns with out untouched. A kernel that
// finds a tag past the arrival it waited for knows that the peer has
// already failed this call and moved on: a mismatch too. Blocks that a
// rank launched and a peer did not (the grid follows the count) find no
// arrival: they give up as soon as the flag of their own rank holds a
// mismatch (or the abort word is set), not at the timeout.
//
// Cost: on the host, two atomic stores per peer and two loads; on the GPU,
// per block and peer one more 8-byte relaxed store into the peer (issued
// with the arrival, no fence) and one local load after the wait, which the
// peer's store has normally reached with its arrival: no extra round trip.
// The digest is 32 bits: two different argument sets collide with
// probability 2^-32 on the GPU (the host backend compares the packed
// arguments exactly).

// Note [Failed collectives]
//
// A collective's wait that gives up (a timeout, a peer's exit, an abort, a
// wait cut short; on the GPU also a mismatch, after which a kernel skips
// its closing barrier) leaves the ranks' barrier counts and argument slots
// out of step: the rank that gave up had counted its arrival at its peers,
// so a late peer finds that arrival, passes the barrier as if the call had
// met, and reads inputs its peer has since overwritten; from then on the
// ranks run one barrier apart and every call returns success with numbers
// of two calls mixed. Putting the ranks back in step would need them to
// agree on where each stopped, with more waits that can fail the same way.
// So the group's collectives stop (fail-stop, as NCCL asks for a new
// communicator after a timeout):
//
//  1. The rank whose wait gives up writes the cause into its stop word
//     (word 3 of its device region, Note [Pad partition] in core) and
//     core.DevGaveUp(itself, cause, set) into the stop word of every peer
//     it reaches (the view's ranks), before the call returns (the host
//     runner's local.stop; a kernel's symmem_coll_stop).
//  2. Every collective enters through Port.Enter, which reads this rank's
//     stop word with one load of host memory (on the GPU its pinned
//     mirror, which kernels write; no device synchronisation) and refuses
//     the call with ErrInvalidState naming the first failure and saying
//     what to do: abort the group, destroy it, make a new one.
//  3. A host runner's wait that finds its stop word set gives up at once:
//     a peer that gave up will not arrive (it reports the exit of the rank
//     it waits for when that rank is gone). A kernel's wait does not read
//     the stop word: it ends at its own timeout or abort, so that the
//     device error flag keeps naming its own cause (a mismatch, a peer's
//     exit), and stops the group in its turn.
//  4. A kernel reads its stop word when it starts and again after its
//     opening barrier; set, it copies it to the mirror and returns
//     without arriving anywhere or touching its output. So the kernels
//     enqueued before the failure was seen on the host refuse to run as
//     well, and a CUDA graph's replays refuse at their kernels (a replay
//     has no host-side entry in the library: the failure shows at the
//     next call of the library on the group).
//
// A late peer finds the stop word at its entry (refused), or arrived while
// its peer still waited (the call met), or passed its entry just before
// its peer gave up: then its closing barrier waits for an arrival that
// never comes and gives up (at once on the host, at its timeout on the
// GPU), so that call fails too (what
// it wrote to its output is undefined; the call does not succeed). On the
// GPU a call returns once its kernel is enqueued: a failure shows at the
// next host-side call on the group after the kernel gave up. A mismatch on
// the host backend keeps the barriers balanced (Note [Collective
// agreement]) and stops nothing.

// argsWord packs what all ranks of a collective must agree on (Note
// [Collective agreement]): count in bits 0..52 (< 2^53: it fits in a
// buffer), kind 53..54, dtype 55..56, op 57..58 (0 for all_gather), the
// kernels' algorithm (core.Collective.KernelAlgo) 59..61.
func argsWord(c *core.Collective) uint64 {
	switch {
	case c.Kind == core.AllToAll && c.V != nil:
		return a2aWord(c)
	case c.Kind == core.AllToAll: // no op; the copy engines' form in the op's bits
		ce := uint64(0)
		if c.Algo == core.AlgoCopyEngine {
			ce = 1 << 57
		}
		return uint64(c.Count)&(1<<53-1) | uint64(c.Kind)&3<<53 | uint64(c.DType)&3<<55 | ce
	}
	op := uint64(c.Op)
	if c.Kind == core.AllGather {
		op = 0
	}
	return uint64(c.Count)&(1<<53-1) | uint64(c.Kind)&3<<53 | uint64(c.DType)&3<<55 | op&3<<57 | uint64(c.KernelAlgo())&7<<59
}

// argsDigest is the 32-bit digest of argsWord (a splitmix64 finalizer).
func argsDigest(w uint64) uint32 {
	w ^= w >> 30
	w *= 0xbf58476d1ce4e5b9
	w ^= w >> 27
	w *= 0x94d049bb133111eb
	w ^= w >> 31
	return uint32(w >> 32)
}

// argsText names packed arguments as a call would: all_reduce(float32,
// sum, count 1024, one_shot).
func argsText(w uint64) string {
	kind, dt, op, algo := core.CollKind(w>>53&3), core.DType(w>>55&3), core.ReduceOp(w>>57&3), uint32(w>>59&7)
	count := w & (1<<53 - 1)
	if kind == core.AllToAll {
		return a2aText(w)
	}
	if kind == core.AllGather && algo == core.KernelCopyEngine {
		return fmt.Sprintf("%s(%s, count %d, %s)", kind, dt, count, core.AlgoCopyEngine)
	}
	if kind == core.AllGather {
		return fmt.Sprintf("%s(%s, count %d)", kind, dt, count)
	}
	return fmt.Sprintf("%s(%s, %s, count %d, %s)", kind, dt, op, count, core.KernelAlgoName(algo))
}

// autoAllReduce is AlgoAuto resolved for world ranks and n bytes of input;
// outInBlock says whether out lies inside the rendezvoused block at one
// offset everywhere (which two-shot needs).
func autoAllReduce(world int, n uintptr, inPlace, outInBlock bool) core.Algo {
	switch {
	case !outInBlock || n <= OneShotMaxBytes:
		return core.AlgoOneShot
	case world == 2 && (!inPlace || n <= OneShotInPlaceMaxBytes2):
		return core.AlgoOneShot
	}
	return core.AlgoTwoShot
}

// TwoShotPullMinBytes is the smallest two-shot all-reduce (bytes of each
// rank's input) whose second phase pulls (Note [Two-shot pulls]);
// SYMMEM_TWO_SHOT_PULL_MIN_BYTES overrides it (the same on every rank).
var TwoShotPullMinBytes = uintptr(core.Current().Size("SYMMEM_TWO_SHOT_PULL_MIN_BYTES", 8<<20))

// OneShotMaxBytes is the largest all-reduce (bytes of each rank's input)
// that AlgoAuto runs one-shot in place, or at world >= 3, and
// OneShotInPlaceMaxBytes2 the largest it runs one-shot in place at world 2
// (Note [All-reduce choice]); SYMMEM_ONE_SHOT_MAX_BYTES overrides both.
var OneShotMaxBytes, OneShotInPlaceMaxBytes2 = oneShotMax()

func oneShotMax() (any, two uintptr) {
	const unset = math.MaxUint64
	if v := core.Current().Size("SYMMEM_ONE_SHOT_MAX_BYTES", unset); v != unset {
		return uintptr(v), uintptr(v)
	}
	return 256 << 10, 1 << 20
}

// Args is one collective call.
type Args struct {
	Kind  core.CollKind
	DType core.DType
	Op    core.ReduceOp
	Algo  core.Algo
	Count uintptr
	// Out is this rank's output; 0 means in place (all_reduce only).
	Out uintptr
	// In is this rank's input when it is not at the rendezvous pointer
	// (0: it is there); only the low-latency path takes such an input
	// (Note [Inputs outside the block]).
	In      uintptr
	Channel int
	Stream  core.Stream
	// V is an all-to-all's split-driven form (nil: equal splits of Count
	// elements per rank; Note [All-to-all]).
	V *A2AArgs
}

// Run checks a and runs it over the handle behind p: enqueued on a.Stream where the backend
// launches kernels, on this thread where its memory is CPU-addressable,
// through the group's engine on a group that spans machines (Note
// [Collectives across machines] in core/symm). On any error nothing ran.
func Run(p Port, a Args) error {
	leave, err := p.Enter()
	if err != nil {
		return err
	}
	defer leave()
	h := target{p.Symmetric(), p}
	return runEntered(&h, a)
}

// runEntered is Run once the call is admitted.
func runEntered(h *target, a Args) error {
	if a.Kind == core.AllToAll && a.In != 0 {
		return core.Errorf(core.ErrInvalidArgument, "group %q: %s: the all-to-all reads every peer's input from its block, so its input must be at the rendezvous pointer (in must be NULL)", h.GroupName, a.Kind)
	}
	if a.Kind == core.AllToAll {
		c, err := planAllToAll(h, a)
		if err != nil || c == nil {
			return err
		}
		if h.Span != nil {
			return h.allToAllAcross(a, c)
		}
		return wholeGroup(h).run(c, a.Stream)
	}
	c, err := plan(h, a)
	if err != nil || c == nil {
		return err
	}
	if h.Span != nil {
		return h.runAcross(a, c)
	}
	return wholeGroup(h).run(c, a.Stream)
}

func overlap(a, an, b, bn uintptr) bool { return a < b+bn && b < a+an }

// plan validates a and resolves it into a core.Collective (nil: count 0,
// nothing to do).
func plan(h *target, a Args) (*core.Collective, error) {
	what := a.Kind.String()
	bad := func(format string, args ...any) (*core.Collective, error) {
		return nil, core.Errorf(core.ErrInvalidArgument, "group %q: %s: "+format, append([]any{h.GroupName, what}, args...)...)
	}
	if !a.Kind.Valid() {
		return bad("unknown collective %d (known: %s)", int32(a.Kind), core.Known[core.CollKind]())
	}
	if !a.DType.Valid() {
		return bad("unknown dtype %d (known: %s)", int32(a.DType), core.Known[core.DType]())
	}
	if a.Kind != core.AllGather && !a.Op.Valid() {
		return bad("unknown reduction op %d (known: %s)", int32(a.Op), core.Known[core.ReduceOp]())
	}
	if !a.Algo.Valid() {
		return bad("unknown algorithm %d (known: %s)", int32(a.Algo), core.Known[core.Algo]())
	}
	if a.Channel < 0 || a.Channel >= core.CollChannels {
		return bad("collective channel %d is out of range [0, %d)", a.Channel, core.CollChannels)
	}
	if a.Count == 0 {
		return nil, nil
	}
	rank, world, bufSize, offset := h.Rank, h.World, h.BufferSize, h.Offset
	es, w := a.DType.Size(), uintptr(world)
	pads := h.SignalPads
	base := h.Buffers[rank]
	in := base + offset
	outside := a.In != 0 && a.In != in // Note [Inputs outside the block]
	if outside {
		if a.Count > core.LowLatencyMaxBytes*w/es {
			return bad("the input %#x is outside the rendezvoused block, which only the low-latency path takes, and count %d of %s (%d bytes) is past its buffers (SYMMEM_LL_MAX_BYTES %d per rank and peer)", a.In, a.Count, a.DType, a.Count*es, core.LowLatencyMaxBytes)
		}
		in = a.In
	} else if room := bufSize - offset; a.Count > room/es {
		return bad("count %d of %s (%d bytes) is past the buffer: %d bytes from the rendezvous offset %d to the block's end", a.Count, a.DType, a.Count*es, room, offset)
	}
	inBytes := a.Count * es
	out, outBytes := a.Out, inBytes
	inPlace := false
	switch a.Kind {
	case core.AllReduce:
		if out == 0 {
			out = in
		}
		inPlace = out == in
	case core.AllGather:
		outBytes = inBytes * w
		inPlace = out != 0 && out+uintptr(rank)*inBytes == in
	case core.ReduceScatter:
		if a.Count%w != 0 {
			return bad("count %d is not a multiple of the world size %d", a.Count, w)
		}
		outBytes = inBytes / w
		inPlace = out == in+uintptr(rank)*outBytes
	}
	if out == 0 {
		return bad("out is NULL (only all_reduce may default to in place)")
	}
	if in%16 != 0 || out%16 != 0 {
		return bad("input %#x and out %#x must be 16-byte aligned (the kernels move 16 bytes at a time)", in, out)
	}
	if !inPlace && overlap(in, inBytes, out, outBytes) {
		return bad("out [%#x, +%d) overlaps the input [%#x, +%d) in a way the operation cannot do (in place means out == input for all_reduce, out + rank*count elements == input for all_gather, out == input + rank*count/world elements for reduce_scatter)", out, outBytes, in, inBytes)
	}
	outOff := int64(-1)
	if out >= base && out-base+outBytes <= bufSize {
		outOff = int64(out - base)
	}
	algo := a.Algo
	team := h.team()
	ll, llWhy := lowLatencyFits(h, a, inBytes)
	switch {
	case outside && team != nil:
		return bad("the input %#x is outside the rendezvoused block, which only the low-latency path takes, and this group spans machines (its engine and its team's kernels read the inputs from the blocks)", a.In)
	case outside && algo != core.AlgoAuto && algo != core.AlgoLowLatency:
		return bad("the input %#x is outside the rendezvoused block: %s reads the peers' inputs from their blocks; only low_latency (or auto) reads nothing but this rank's own input", a.In, algo)
	case outside && world == 1 && launchesKernels(h):
		algo = core.AlgoOneShot // one rank: the kernel reads its own input only
	case outside && !ll:
		return bad("the input %#x is outside the rendezvoused block, which only the low-latency path takes, and that path cannot run this call: %s", a.In, llWhy)
	case outside:
		algo = core.AlgoLowLatency
	case team != nil && algo == core.AlgoCopyEngine:
		return bad("copy_engine runs on a group of one machine (the copy engines reach the mapped peers only); use auto, hierarchical or nccl")
	case team != nil:
		// The group's engine or the hierarchical form runs it with the
		// caller's algo: neither uses the fields below but Kind, DType,
		// Op, Count, Out and OutOffset (runAcross decides).
	case wantsCopyEngine(algo) || autoCopyEngine(h, a, inBytes):
		algo = core.AlgoCopyEngine // Note [Copy-engine collectives]
	case world == 1:
		algo = core.AlgoOneShot
	case algo == core.AlgoLowLatency && !launchesKernels(h):
		algo = core.AlgoOneShot // the host backend's one form (same results)
	case algo == core.AlgoLowLatency && !ll:
		return bad("low_latency cannot run this call: %s", llWhy)
	case algo == core.AlgoLowLatency:
	case ll && (a.Kind != core.AllReduce || algo != core.AlgoOneShot && algo != core.AlgoTwoShot):
		// Whatever fits the low-latency buffers runs there (auto, and on
		// one machine hierarchical and nccl, which choose as auto does).
		algo = core.AlgoLowLatency
	case a.Kind != core.AllReduce:
		algo = core.AlgoOneShot
	case algo == core.AlgoAuto || algo == core.AlgoHierarchical || algo == core.AlgoNCCL:
		// On one machine hierarchical and nccl have no level above it:
		// they choose as auto does.
		algo = autoAllReduce(world, inBytes, inPlace, outOff >= 0)
	case algo == core.AlgoTwoShot && outOff < 0:
		return bad("two-shot reads every rank's out, so out must lie inside the rendezvoused block (out %#x is outside [%#x, +%d))", out, base, bufSize)
	}
	pull := algo == core.AlgoTwoShot && inBytes >= TwoShotPullMinBytes
	bufArr, padArr := h.BufferArray, h.PadArray // device arrays (the host ones on the host backend)
	padSize := h.SignalPadSize
	inOffset := offset
	if outside {
		// The kernel finds its input at its own block + InOffset: this
		// offset (modulo 2^64) lands on a.In. No peer reads it on the
		// low-latency path (Note [Inputs outside the block]).
		inOffset = a.In - base
	}
	c := &core.Collective{Kind: a.Kind, DType: a.DType, Op: a.Op, Algo: algo, Pull: pull, Count: a.Count, Rank: rank, World: world,
		Buffers: bufArr, Pads: padArr, PadSize: padSize, InOffset: inOffset, Out: out, OutOffset: outOff,
		Channel: a.Channel, TimeoutNs: uint64(h.Timeout.Nanoseconds()), Unchecked: collUnchecked}
	if algo == core.AlgoLowLatency {
		c.LLOffset, c.LLSlot, c.PadAddrs = core.LowLatencyOffset(padSize, world), core.LowLatencySlotBytes(), pads
	}
	c.Digest = argsDigest(argsWord(c))
	return c, nil
}
