package coll

import "github.com/libsymmem/libsymmem/core"

// Note [Hierarchical all-reduce]
//
// On a group whose ranks are on several machines (teams, Note [Local
// teams] in core/symm), with M teams of L ranks each, an all-reduce of n bytes per rank
// runs in one of two forms:
//
//   - nccl: the whole call on the group's communicator, on the registered
//     window (Note [Collectives across machines] in core/symm). NCCL picks ring or tree
//     over all M*L ranks; a ring moves 2(ML-1)/(ML)*n bytes through every
//     rank, and its links between machines carry the same.
//   - hierarchical: (1) a reduce-scatter inside each team with the
//     library's own collective (kernels over NVLink-mapped memory, runHost
//     on the host backend): local rank l ends with slice l (n/L bytes) of
//     its team's sum, in out; (2) an all-reduce of slice l across teams
//     through NCCL, on a communicator split from the group's (color =
//     local rank, key = rank: the M ranks of local rank l, one per team),
//     in place in out; (3) an all-gather inside each team of every slice
//     (our kernel, in place: rank p's slice already sits at slice p of its
//     own out). Between machines each rank moves 2(M-1)/M*n/L bytes, L
//     ranks of a machine in parallel on their own NICs: 2(M-1)/M*n per
//     machine, the least any all-reduce can move, against the ring's
//     2(ML-1)/(ML)*n through the machine's ring links. Inside the team it
//     adds the two local phases, each ~(L-1)/L*n bytes over NVLink.
//
// Choice (auto, the same on every rank: it reads only what every rank
// agrees on, and where out lies, which must be alike on every rank as for
// two-shot): hierarchical when the communicator splits and reduces, every
// team has the same size L >= 2, the backend runs the library's
// collectives here (kernels loaded, by the first call that asks; the
// stand-in driver has none), out lies inside the rendezvoused block at one
// offset everywhere (step 3 reads the peers' out), and n >= HierMinBytes;
// nccl otherwise. HierMinBytes is 256 KiB, where the two cross on two
// imitated machines of 2 x H200 each (bench/multihost_bench.py --imitate
// 2x2, docs/measurements.md, "Two imitated machines"): NCCL alone 88-90
// us against 118-120 us hierarchical at 64 KiB, 243-250 us against
// 193-194 us at 256 KiB, 1478-1501 us against 843-852 us at 4 MiB. Between
// those machines NCCL runs its socket transport (about 5 GB/s), so the
// bytes that the local phases keep off the network count for more than
// on a fast fabric; on real machines time algo "hierarchical" against
// "nccl" with the same bench and set SYMMEM_HIER_MIN_BYTES (the same on
// every rank) to where they cross.
// algo "hierarchical" or "nccl" overrides the choice; "hierarchical" where
// it cannot run (teams of different sizes, out outside the block, no
// split) is an error naming the reason, never a silent fallback.
//
// Counts: slices are per = floor(count/(L*v))*v elements (v = 16 bytes
// of elements: the kernels move 16 bytes at a time and every slice must
// start 16-byte aligned); the tail of count - L*per elements (< L*v) is
// all-reduced inside the team (one-shot) and then across teams through
// the same split communicators (every local rank holds the same team sum,
// so the M-rank all-reduces of the L communicators give one result). With
// L = 1 the local phases are empty: one NCCL all-reduce from the input to
// out over the split communicator (which then holds every rank).
//
// Reduction order and determinism: inside a team, local rank order
// 0..L-1 (group rank order), fp32 accumulation for 16-bit types, rounded
// once to the element type; across teams, NCCL's order over the M partial
// sums (ring or tree, its choice by size and topology), for 16-bit types
// on the rounded partial sums. So a float result may differ in the last
// bits from the nccl form and from the one-machine kernels; for a fixed
// topology, size, NCCL version and NCCL_ALGO/NCCL_PROTO it repeats run to
// run. int32 sums (wrapping), max and min are exact: equal in every form.
//
// all_gather and reduce_scatter run on the engine whole whatever algo
// says: with ranks numbered machine by machine (rank = team*L + l, the
// usual launch), the split communicator of local rank l holds slices that
// are L apart in the output, so a two-level form needs a transpose in
// staging memory, and it moves no fewer bytes between machines than
// NCCL's ring does: every remote rank's part enters a machine once either
// way (all-gather), every partial sum leaves it once (reduce-scatter).
//
// Agreement: the local phases are our collectives on the team view, so
// the team's ranks compare their arguments at each phase's opening barrier
// as on one machine (Note [Collective agreement]); across machines, as in
// the nccl form, NCCL receives what each rank passes.
//
// Capture: everything is enqueued on the caller's stream (kernels, NCCL),
// with no host synchronisation; the split communicator is made by the
// first hierarchical call (ncclCommSplit, a host-side collective that every
// rank enters, as every rank enters the call), so a CUDA graph is captured
// after one call has run, as NCCL itself needs.

// Note [Team view]
//
// The local phases run the library's own collectives over a view of the
// handle (teamView): rank = local rank, world = L, the blocks and pads =
// the team's (in rank order), and pointer arrays of its own in host and
// device memory, which core/symm keeps beside the handle's (slots of the
// same slabs, Note [Pointer arrays in the pad]; filled and shared with the
// handle's, Note [Shared pointer arrays]), which the handle's description
// gives (core.SymmetricBuffer.TeamBufferArray, TeamPadArray). Its
// kernels and runHost lay out the library's region of each pad as a group
// of L ranks would (Note [Pad partition] in core); the region was sized
// for the whole world (DeviceRegionBytes(W) >= DeviceRegionBytes(L)), so
// it fits. Nothing else of a group that spans machines uses that region's
// sets or argument slots: its collectives go to the engine or through this
// view, its barriers use the users' slots and word 2 (Note [Collectives
// across machines] in core/symm), and a users' device barrier over the
// whole world cannot complete, since remote ranks have no pad pointers, so
// a correct program runs none; only ranks of one team ever touch each
// other's pads. So the view's barriers, counts and argument slots meet no
// other writer, and the header words keep their meaning: the abort word
// and a peer-exited flag name a group rank (the host writes them), a
// timeout or mismatch flag a view rank (core/symm's DeviceErrorText names
// its group rank). local.ranks maps view ranks to group ranks in errors
// and liveness checks.

// HierMinBytes is the smallest all-reduce (bytes of each rank's input)
// that AlgoAuto runs hierarchically on a group that spans machines (Note
// [Hierarchical all-reduce]); SYMMEM_HIER_MIN_BYTES overrides it (the same
// on every rank).
var HierMinBytes = uintptr(core.Current().Size("SYMMEM_HIER_MIN_BYTES", 256<<10))

// hierPlan says whether a checked collective c runs hierarchically; for an
// explicit AlgoHierarchical that cannot, why (an error).
func (h *target) hierPlan(a Args, c *core.Collective) (bool, error) {
	if c.Kind != core.AllReduce || (a.Algo != core.AlgoAuto && a.Algo != core.AlgoHierarchical) {
		return false, nil
	}
	explicit := a.Algo == core.AlgoHierarchical
	refuse := func(code core.Code, format string, args ...any) (bool, error) {
		if !explicit {
			return false, nil
		}
		return false, core.Errorf(code, "group %q: rank %d: all_reduce with algo hierarchical: "+format, append([]any{h.GroupName, h.Rank}, args...)...)
	}
	if _, ok := h.engine().(core.Splitter); !ok {
		return refuse(core.ErrUnavailable, "it needs a communicator that splits (ncclCommSplit); %s does not", h.engine().Describe())
	}
	if uniform, sizes := h.Span.Uniform, h.Span.TeamSizes; !uniform {
		return refuse(core.ErrUnavailable, "it needs teams of one size (each local rank's communicator holds one rank per team); the teams have %s rank(s)", sizes)
	}
	if h.state().split.isClosed() {
		return refuse(core.ErrInvalidState, "the group is destroyed: its communicator split by local rank is closed")
	}
	if c.OutOffset < 0 {
		return refuse(core.ErrInvalidArgument, "the all-gather inside the team reads the peers' out, so out must lie inside the rendezvoused block (out %#x is outside [%#x, +%d))", c.Out, h.Buffers[h.Rank], h.BufferSize)
	}
	team := h.team()
	if !explicit && (len(team) < 2 || c.Count*c.DType.Size() < HierMinBytes) {
		return false, nil
	}
	if len(team) >= 2 {
		if err := h.runsLocal(); err != nil {
			return refuse(core.ErrUnavailable, "the steps inside the team need the library's own collectives, which cannot run here: %v", err)
		}
	}
	return true, nil
}

// runsLocal says why the backend cannot run the library's collectives here,
// or nil (the same on every rank of one build and driver). A backend that
// loads kernels does so once per process and device (Note [Kernels
// compiled at run time] in cuda: compiled once, then read from the disk
// cache) and gives later calls the first call's answer.
func (h *target) runsLocal() error {
	be, device := h.Backend, h.Device
	if _, ok := be.(core.CollectiveLauncher); ok {
		if l, ok := be.(core.KernelLoader); ok {
			_, err := l.LoadKernels(device)
			return err
		}
		return nil
	}
	if be.Capabilities().StreamSignals {
		return core.Errorf(core.ErrUnavailable, "the backend launches no kernels and its memory is not the CPU's")
	}
	return nil
}

// hierAllReduce runs c (an all-reduce, out inside the block) in the
// hierarchical form (Note [Hierarchical all-reduce]).
func (h *target) hierAllReduce(a Args, c *core.Collective) error {
	sub, done, err := h.splitByLocalRank()
	if err != nil {
		return core.Errorf(core.CodeOf(err), "group %q: rank %d: all_reduce (hierarchical): %v", h.GroupName, h.Rank, err)
	}
	defer done()
	subRed, ok := sub.(core.Reducer)
	if !ok {
		return core.Errorf(core.ErrUnavailable, "group %q: all_reduce (hierarchical): the split communicator %s runs no typed collectives", h.GroupName, sub.Describe())
	}
	what := "all_reduce (hierarchical) across machines"
	t, ok := teamView(h)
	if !ok {
		return core.Errorf(core.ErrInternal, "group %q: rank %d: all_reduce (hierarchical): the handle has no team view", h.GroupName, h.Rank)
	}
	es := c.DType.Size()
	in, out := h.Buffers[h.Rank]+c.InOffset, c.Out
	L := t.world
	if L == 1 {
		if err := subRed.AllReduce(a.Stream, in, out, c.Count, c.DType, c.Op); err != nil {
			h.stopAfterEngine(c)
			return h.Span.EngineErr(what, err)
		}
		return nil
	}
	vec := 16 / es
	per := c.Count / (uintptr(L) * vec) * vec
	body := per * uintptr(L)
	tail := c.Count - body
	outOff := uintptr(c.OutOffset)
	mine := t.bufs[t.rank]
	if per > 0 {
		slice := outOff + uintptr(t.rank)*per*es
		if err := t.run(t.collective(c, core.ReduceScatter, body, c.InOffset, slice, false), a.Stream); err != nil {
			return err
		}
		if err := subRed.AllReduce(a.Stream, mine+slice, mine+slice, per, c.DType, c.Op); err != nil {
			h.stopAfterEngine(c)
			return h.Span.EngineErr(what, err)
		}
		if err := t.run(t.collective(c, core.AllGather, per, outOff, outOff, true), a.Stream); err != nil {
			return err
		}
	}
	if tail > 0 {
		at := body * es
		if err := t.run(t.collective(c, core.AllReduce, tail, c.InOffset+at, outOff+at, false), a.Stream); err != nil {
			return err
		}
		if err := subRed.AllReduce(a.Stream, out+at, out+at, tail, c.DType, c.Op); err != nil {
			h.stopAfterEngine(c)
			return h.Span.EngineErr(what, err)
		}
	}
	return nil
}
