package coll

import (
	"fmt"
	"strings"
	"time"

	"github.com/libsymmem/libsymmem/core"
)

// Note [All-to-all across machines]
//
// On a group that spans machines (Note [Collectives across machines] in
// core/symm) every form of the all-to-all (Note [All-to-all]) is one call
// with the one-machine semantics: the same layouts, out_splits_offsets and
// refusals. The library carries no byte between machines itself: the rows
// for remote ranks go through the group's engine as point-to-point
// transfers (core.SendRecver: ncclSend / ncclRecv between ncclGroupStart
// and ncclGroupEnd, one group per call, on the caller's stream), reading
// this rank's input in the rendezvoused block and writing out.
//
// Equal splits (sizes known on the host, nothing synchronised with it):
//
//   - When this rank's team is consecutive group ranks t0..t0+L-1 (the
//     usual launch numbers ranks machine by machine), L >= 2 and the
//     backend runs the library's collectives here, the team's chunks move
//     through the mapped memory: the team view's own all-to-all (Note
//     [Team view]: the same kernel or host runner, with its barriers and
//     argument agreement among the team), over the part of the input and
//     of out that belongs to the team. Chunk p of a rank's input is for
//     group rank p, and the view numbers the team 0..L-1, so the view's
//     input starts t0 chunks into the block and its out t0 chunks into
//     out: view rank k's chunk for view rank l is then group rank
//     (t0+k)'s chunk for group rank t0+l, landing at (t0+k)*count of its
//     out, as the group's layout says. Then one engine group: a send of
//     chunk p and a receive into out at p*count for every remote rank p.
//     The two run one after the other on the stream: NCCL's transfers
//     start when the team's kernel ends. Overlapping them (the engine
//     group on a second stream, joined by events) saves at most the
//     shorter of the two; that is for measurement on real machines
//     (bench/multihost_bench.py) to justify.
//   - Otherwise (a team of other ranks, e.g. machines interleaved rank by
//     rank, where the view's chunks would not be consecutive; a lone rank
//     on its machine; a backend without the library's kernels here) every
//     chunk, this machine's and this rank's own included, goes through the
//     engine group, which moves the machine's chunks over its own paths
//     (NVLink P2P or shared memory for NCCL). Same results; what it costs
//     is the team's chunks passing through NCCL's buffers instead of one
//     load and store each, and no argument agreement among the team.
//
// The split-driven forms: NCCL needs every transfer's size on the host,
// and the sizes are in device memory, so each call synchronises with the
// host: (1) an engine all-gather of each rank's arguments (layout,
// row_bytes, experts, out_rows, major_align) into the group's staging
// memory (Port.Staging), copied to the host: ranks that differ fail
// with ErrMismatch naming every rank's arguments, before anything whose
// size depends on them; (2) an engine all-gather of every rank's table
// (S splits, and for the combine S offsets), copied to the host. Every
// rank then knows every rank's table and applies Note [All-to-all]'s rules
// to all of them alike: a table with a negative split or one past its
// input (the block from the rendezvous offset) fails the call on every
// rank naming that sender, with nothing moved and out_splits_offsets
// untouched; each rank writes its out_splits_offsets (copied to device
// memory) as a2aSource and a2aOutOffsets lay them out; a receiver whose
// rows would pass out_rows gets nothing, and every sender, knowing it,
// posts nothing to it: that receiver's call returns ErrInvalidArgument
// naming it (an error return: the host knows it, no device flag), the
// others succeed. (3) One engine group moves every piece of at least one
// row: entry j of a sender's table, rows from its source offset, to the
// receiver's out at the piece's offset; between two ranks the pieces go in
// expert order on both sides, which is how NCCL pairs them. The team's
// pieces go through the engine too: their places in out interleave with
// the remote ranks' (the dispatch groups by expert, every expert's group
// holds a piece of every rank), so the team view's kernel, which lays out
// its own pieces, cannot place them; a kernel that copies a list of
// pieces the host computed, over the team view, would. The cost of the
// split-driven forms across machines: two small all-gathers and five
// copies (the arguments and out_splits_offsets from the host, the table
// into the staging memory, the two all-gathers' results to the host), each
// waited for, per call (tens of microseconds across machines), and no CUDA
// graph capture (the driver refuses a wait inside a capture: the call
// fails with the driver's error, and the capture with it).
//
// Agreement: the split-driven forms compare every rank's arguments
// exactly (step 1). The equal form compares them among the team in the
// team view's call (Note [Collective agreement]); across machines, as in
// the nccl form of the other collectives, NCCL receives what each rank
// passes (the stand-in refuses a receive whose size differs from its
// send, naming both), since a comparison there would cost a wait.
//
// Every wait for the GPU is bounded by the handle's timeout: on expiry
// (a rank on another machine died, or never called) the call fails with
// ErrTimeout naming the remote ranks, and the staging memory is retired,
// since the GPU may still write it.

// a2aArgWords is the arguments the ranks of a split-driven all-to-all
// across machines compare: layout, row_bytes, experts, out_rows,
// major_align (0 unless the dispatch).
const a2aArgWords = 5

// allToAllAcross runs checked all-to-all c on a group that spans machines (Note
// [All-to-all across machines]).
func (h *target) allToAllAcross(a Args, c *core.Collective) error {
	what := "all_to_all"
	if c.V != nil {
		what = c.V.Layout.String()
	}
	engine := h.engine()
	if engine == nil {
		return h.Span.NoEngine(what)
	}
	p2p, ok := engine.(core.SendRecver)
	if !ok {
		return core.Errorf(core.ErrUnavailable, "group %q: %s across machines needs point-to-point transfers (ncclSend/ncclRecv) from %s, which it lacks", h.GroupName, what, engine.Describe())
	}
	if c.V == nil {
		return h.equalAllToAll(a, c, p2p)
	}
	return h.splitAllToAll(a, c, engine, p2p, what)
}

// mappedTeam is the local run of the team view when the team's chunks can
// move through the mapped memory (Note [All-to-all across machines]), and
// the group rank its team starts at; ok is false when every chunk goes
// through the engine.
func (h *target) mappedTeam() (t local, first int, ok bool) {
	team := h.team()
	if len(team) < 2 {
		return local{}, 0, false
	}
	for i, r := range team {
		if r != team[0]+i {
			return local{}, 0, false
		}
	}
	if h.runsLocal() != nil {
		return local{}, 0, false
	}
	t, ok = teamView(h)
	return t, team[0], ok
}

// equalAllToAll runs the equal-split all-to-all across machines.
func (h *target) equalAllToAll(a Args, c *core.Collective, p2p core.SendRecver) error {
	rank, world := h.Rank, h.World
	n := c.Count * c.DType.Size()
	in := h.Buffers[rank] + c.InOffset
	t, first, mapped := h.mappedTeam()
	var ops []core.P2POp
	for k := 0; k < world; k++ {
		p := (rank + k) % world
		if mapped && p >= first && p < first+t.world {
			continue
		}
		ops = append(ops, core.P2POp{Peer: p, Addr: in + uintptr(p)*n, Bytes: n},
			core.P2POp{Peer: p, Addr: c.Out + uintptr(p)*n, Bytes: n, Recv: true})
	}
	if mapped {
		at := uintptr(first) * n
		lc := &core.Collective{Kind: core.AllToAll, DType: c.DType, Algo: core.AlgoOneShot, Count: c.Count, Rank: t.rank, World: t.world,
			Buffers: t.bufArr, Pads: t.padArr, PadSize: h.SignalPadSize, InOffset: c.InOffset + at, Out: c.Out + at, OutOffset: -1,
			Channel: c.Channel, TimeoutNs: c.TimeoutNs, Unchecked: c.Unchecked}
		lc.Digest = argsDigest(argsWord(lc))
		if err := t.run(lc, a.Stream); err != nil {
			return err
		}
	}
	if err := p2p.SendRecv(a.Stream, ops); err != nil {
		return h.Span.EngineErr("all_to_all", err)
	}
	return nil
}

// a2aEntry is the index in a table of the entry for rank q's expert e.
func a2aEntry(v *core.AllToAllV, world, q, e int) int {
	switch v.Layout {
	case core.A2AV2D:
		return q*v.Experts + e
	case core.A2AV2DOffset:
		return e*world + q
	}
	return q
}

// a2aTables is every rank's split table of one call, as the host sees it.
type a2aTables struct {
	v     *core.AllToAllV
	world int
	// splits[s][j] and src[s][j]: entry j of rank s's table and the row
	// of s's input it starts at.
	splits, src [][]int64
}

// badSender is the first rank whose table has a negative split or rows
// past its input, or -1.
func (t *a2aTables) badSender() int {
	in := int64(t.v.InRows)
	for s := range t.splits {
		for j, n := range t.splits[s] {
			off := t.src[s][j]
			if n < 0 || off < 0 || n > in || off > in-n {
				return s
			}
		}
	}
	return -1
}

// received is what rank r receives, in output order: splits, source rows,
// out rows, and the rows the layout takes in all.
func (t *a2aTables) received(r int) (splits, src, offs []int64, total int64) {
	S := t.v.Splits(t.world)
	splits, src = make([]int64, S), make([]int64, S)
	for i := 0; i < S; i++ {
		s, j := a2aSource(t.v, t.world, r, i)
		splits[i], src[i] = t.splits[s][j], t.src[s][j]
	}
	offs, total = a2aOutOffsets(t.v, t.world, splits)
	return splits, src, offs, total
}

// splitAllToAll runs a split-driven all-to-all across machines.
func (h *target) splitAllToAll(a Args, c *core.Collective, engine core.Communicator, p2p core.SendRecver, what string) error {
	v, rank, world := c.V, h.Rank, h.World
	S := v.Splits(world)
	words := S
	if v.Layout == core.A2AV2DOffset {
		words = 2 * S
	}
	argBytes, tableBytes := uintptr(8*a2aArgWords), uintptr(8*words)
	w := uintptr(world)
	// Staging: this rank's record and every rank's, for the larger of the
	// two exchanges, then room for out_splits_offsets on the host.
	rec := max(argBytes, tableBytes)
	dev, host, done, err := h.port.Staging(rec*(w+1) + uintptr(16*S))
	if err != nil {
		return core.Errorf(core.CodeOf(err), "group %q: rank %d: %s across machines: %v", h.GroupName, rank, what, err)
	}
	var broken error
	defer func() { done(broken) }()
	be, device := h.Backend, h.Device
	// gather all-gathers n bytes per rank that fill puts at dev, and
	// returns every rank's, copied to the host.
	gather := func(step string, fill func() error, n uintptr) ([]int64, error) {
		err := h.bounded(func() error {
			if err := fill(); err != nil {
				return err
			}
			if err := engine.AllGather(a.Stream, dev, dev+n, n); err != nil {
				return err
			}
			return be.Copy(device, a.Stream, host+n, dev+n, n*w)
		}, &broken)
		if err != nil {
			return nil, h.Span.EngineErr(fmt.Sprintf("%s: %s", what, step), err)
		}
		return int64s(host+n, int(n/8)*world), nil
	}
	mine := []int64{int64(v.Layout), int64(v.RowBytes), int64(v.Experts), int64(v.OutRows), v.MajorAlign}
	args, err := gather("the all-gather of the arguments", func() error {
		copy(int64s(host, a2aArgWords), mine)
		return be.Copy(device, a.Stream, dev, host, argBytes)
	}, argBytes)
	if err != nil {
		return err
	}
	if err := h.a2aAgree(what, args); err != nil {
		return err
	}
	all, err := gather("the all-gather of the split tables", func() error {
		return be.Copy(device, a.Stream, dev, v.InSplits, tableBytes)
	}, tableBytes)
	if err != nil {
		return err
	}
	t := &a2aTables{v: v, world: world, splits: make([][]int64, world), src: make([][]int64, world)}
	for s := 0; s < world; s++ {
		row := all[s*words : (s+1)*words]
		t.splits[s], t.src[s] = row[:S], make([]int64, S)
		if v.Layout == core.A2AV2DOffset {
			t.src[s] = row[S:]
			continue
		}
		var next int64
		for j, n := range t.splits[s] {
			t.src[s][j] = next
			next += n
		}
	}
	if s := t.badSender(); s >= 0 {
		return core.Errorf(core.ErrInvalidArgument, "group %q: %s: rank %d's splits overrun its input (a negative split, or rows past the %d its buffer holds): nothing was moved",
			h.GroupName, v.Layout, s, v.InRows)
	}
	splits, _, offs, total := t.received(rank)
	so := int64s(host+rec*(w+1), 2*S)
	copy(so, splits)
	copy(so[S:], offs)
	if err := h.bounded(func() error { return be.Copy(device, a.Stream, v.OutSplitsOffsets, host+rec*(w+1), uintptr(16*S)) }, &broken); err != nil {
		return h.Span.EngineErr(what+": writing out_splits_offsets", err)
	}
	overrun := make([]bool, world)
	for q := range overrun {
		_, _, _, tq := t.received(q)
		overrun[q] = tq > int64(v.OutRows)
	}
	ops := h.a2aTransfers(c, t, offs, overrun)
	if err := p2p.SendRecv(a.Stream, ops); err != nil {
		return h.Span.EngineErr(what, err)
	}
	if overrun[rank] {
		return core.Errorf(core.ErrInvalidArgument, "group %q: %s: rank %d receives %d rows (as laid out), more than the %d out holds: nothing was moved",
			h.GroupName, v.Layout, rank, total, v.OutRows)
	}
	return nil
}

// a2aTransfers is this rank's engine group for a split-driven all-to-all:
// every piece of its table for a receiver that does not overrun, and every
// piece it receives unless it overruns; between two ranks in expert order
// on both sides (Note [All-to-all across machines]).
func (h *target) a2aTransfers(c *core.Collective, t *a2aTables, offs []int64, overrun []bool) []core.P2POp {
	v, rank, world := c.V, h.Rank, h.World
	rb := v.RowBytes
	in := h.Buffers[rank] + c.InOffset
	var ops []core.P2POp
	for k := 0; k < world; k++ {
		q := (rank + k) % world
		if overrun[q] {
			continue
		}
		for e := 0; e < v.Experts; e++ {
			j := a2aEntry(v, world, q, e)
			if n := t.splits[rank][j]; n > 0 {
				ops = append(ops, core.P2POp{Peer: q, Addr: in + uintptr(t.src[rank][j])*rb, Bytes: uintptr(n) * rb})
			}
		}
	}
	if overrun[rank] {
		return ops
	}
	for k := 0; k < world; k++ {
		s := (rank - k + world) % world
		for e := 0; e < v.Experts; e++ {
			_, i := a2aTarget(v, world, s, a2aEntry(v, world, rank, e))
			if n := t.splits[s][a2aEntry(v, world, rank, e)]; n > 0 {
				ops = append(ops, core.P2POp{Peer: s, Addr: c.Out + uintptr(offs[i])*rb, Bytes: uintptr(n) * rb, Recv: true})
			}
		}
	}
	return ops
}

// a2aAgree fails, on every rank alike, when the ranks passed different
// arguments (args: every rank's a2aArgWords), naming each rank's.
func (h *target) a2aAgree(what string, args []int64) error {
	world := h.World
	same := true
	for s := 1; s < world; s++ {
		for k := 0; k < a2aArgWords; k++ {
			same = same && args[s*a2aArgWords+k] == args[k]
		}
	}
	if same {
		return nil
	}
	var parts []string
	for s := 0; s < world; s++ {
		x := args[s*a2aArgWords : (s+1)*a2aArgWords]
		parts = append(parts, fmt.Sprintf("rank %d: %s(row_bytes %d, experts %d, out_rows %d, major_align %d)",
			s, core.A2ALayout(x[0]), x[1], x[2], x[3], x[4]))
	}
	return core.Errorf(core.ErrMismatch, "group %q: rank %d: %s: the ranks called different all-to-alls (nothing was moved): %s",
		h.GroupName, h.Rank, what, strings.Join(parts, "; "))
}

// bounded runs fn, which waits for the GPU, for at most the handle's
// timeout. On expiry the error is ErrTimeout and *retired says why the
// staging memory fn uses is never used again (fn may still be running, on
// another goroutine, and the GPU may still write that memory).
func (h *target) bounded(fn func() error, retired *error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	timer := time.NewTimer(h.Timeout)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		*retired = core.Errorf(core.ErrTimeout, "group %q: rank %d: a split-driven all-to-all's wait for the GPU did not end within %v; the GPU may still write the group's staging memory, so nothing that needs it (an all-to-all v form, a rendezvous) runs on this group any more",
			h.GroupName, h.Rank, h.Timeout)
		return core.Errorf(core.ErrTimeout, "a wait for the GPU did not end within %v: a rank did not make the same call, or died", h.Timeout)
	}
}
