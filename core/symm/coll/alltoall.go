package coll

import (
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// Note [All-to-all]
//
// An all-to-all sends chunk p of every rank's input to rank p. Every rank
// reads its chunks from its peers' inputs (the rendezvoused blocks, mapped
// here) and writes only its own out, so out may be any memory of the
// device, and the bytes cross NVLink once, as loads, as in one-shot.
//
// Equal splits (the C symmem_all_to_all): chunk q of rank p's input
// (elements [q*count, (q+1)*count)) lands at p*count of rank q's out. On a
// kernel backend, chunks that fit the low-latency buffers (a multiple of 8
// bytes, up to SYMMEM_LL_MAX_BYTES, channel 0) cross as the low-latency
// path's lines into the receiver's buffer (Note [Low-latency
// collectives]), with no barrier: the all-gather's kernel runs them.
//
// The split-driven forms take their split sizes, in rows of RowBytes, from
// memory the device reads when the call runs (an MoE router writes them on
// the GPU): nothing is synchronised with the host. With W ranks, E experts
// per rank and S = W*E splits, each rank's table has S entries (split j of
// the input, at a row offset), ordered as the layout says:
//
//	A2AV          j = p (E = 1), offsets the exclusive prefix sum
//	A2AV2D        j = p*E + e: rows for expert e of rank p, offsets the
//	              exclusive prefix sum (the dispatch)
//	A2AV2DOffset  j = e*W + p: rows for rank p from its expert e, offsets
//	              given in the table's second row (the combine)
//
// What rank r receives from rank s for its expert e is entry j(r, e) of
// s's table. Rank r lays it out in out in the order
//
//	A2AV, A2AV2DOffset  i = s*E + e (rank-major), packed
//	A2AV2D              i = e*W + s (expert-major), each expert's rows
//	                    starting at a multiple of MajorAlign, and an expert
//	                    that receives nothing still taking MajorAlign rows
//
// and writes split i to OutSplitsOffsets[i] and its row offset to
// OutSplitsOffsets[S + i]: torch 2.11's all_to_all_vdev, _2d and
// _2d_offset, bit for bit.
//
// The tables cross through the pads. Before its opening barrier each rank
// validates its table (a negative split or offset, or rows past its input,
// poison every entry; an empty split's offset is not looked at) and stores entry j into the exchange area (Note [Pad
// partition] in core) of the rank it is for, at that rank's piece index,
// by the call's parity, each word tagged with the call's number (word 6 of
// the rank's device region, which every rank advances once per
// all-to-all, the same on every rank as the calls are). Its opening
// arrival at each peer is a release, so a peer that has seen the arrival
// reads its own area whole, locally. On the GPU every block stores the same
// entries, since each block's barrier pairs it with the peers' same block
// alone; identical stores, so the blocks need no order among themselves. A
// reader compares each word's tag with its own call number: a difference
// means the ranks are a call apart, a mismatch. The parity keeps a
// sender's next entries from overwriting ones a receiver still reads: a
// rank starts call k+2 only after call k's closing barrier, which every
// peer reaches after it has read call k's entries.
//
// A receiver whose rows would pass out (OutRows), and every rank when a
// sender's table is poisoned, writes nothing to out, still writes
// OutSplitsOffsets, and fails the call: the host backend returns
// ErrInvalidArgument naming the rank, a kernel records
// cause 3 with core.DevOverrunSetBit and that rank in the error flag. Every rank still
// makes the closing barrier, so the group stays usable.

// a2aEntryWords packs one entry of a published table: the call's tag in
// bits 48..63, the value in 0..46, a poisoned table's bit 47.
const (
	a2aTagShift = 48
	a2aPoison   = uint64(1) << 47
	a2aValue    = a2aPoison - 1
)

// a2aTag is the tag of call number seq.
func a2aTag(seq uint32) uint64 { return uint64(seq&0xffff) << a2aTagShift }

// A2AArgs is the split-driven part of an all-to-all call (Args.V).
type A2AArgs struct {
	Layout           core.A2ALayout
	RowBytes         uintptr
	Experts          int
	InSplits         uintptr
	OutRows          uintptr
	OutSplitsOffsets uintptr
	MajorAlign       int64
}

// planAllToAll validates an all-to-all call a and resolves it.
func planAllToAll(h *target, a Args) (*core.Collective, error) {
	what := "all_to_all"
	if a.V != nil {
		what = a.V.Layout.String()
	}
	bad := func(format string, args ...any) (*core.Collective, error) {
		return nil, core.Errorf(core.ErrInvalidArgument, "group %q: %s: "+format, append([]any{h.GroupName, what}, args...)...)
	}
	if a.Channel < 0 || a.Channel >= core.CollChannels {
		return bad("collective channel %d is out of range [0, %d)", a.Channel, core.CollChannels)
	}
	if a.V == nil && !a.DType.Valid() {
		return bad("unknown dtype %d (known: %s)", int32(a.DType), core.Known[core.DType]())
	}
	if h.Span != nil && h.engine() == nil {
		return nil, h.Span.NoEngine(what) // Note [All-to-all across machines]
	}
	rank, world, bufSize, offset := h.Rank, h.World, h.BufferSize, h.Offset
	room := bufSize - offset
	in := h.Buffers[rank] + offset
	c := &core.Collective{Kind: core.AllToAll, DType: a.DType, Algo: core.AlgoOneShot, Rank: rank, World: world,
		InOffset: offset, Out: a.Out, OutOffset: -1, Channel: a.Channel, TimeoutNs: uint64(h.Timeout.Nanoseconds()),
		Unchecked: collUnchecked}
	c.Buffers, c.Pads = h.BufferArray, h.PadArray
	c.PadSize = h.SignalPadSize
	if a.V == nil {
		if a.Count == 0 {
			return nil, nil
		}
		es, w := a.DType.Size(), uintptr(world)
		if a.Count > room/es/w {
			return bad("%d ranks x count %d of %s (%d bytes) is past the buffer: %d bytes from the rendezvous offset %d to the block's end", world, a.Count, a.DType, a.Count*es*w, room, offset)
		}
		if a.Out == 0 {
			return bad("out is NULL")
		}
		n := a.Count * es * w
		if overlap(in, n, a.Out, n) {
			return bad("out [%#x, +%d) overlaps the input [%#x, +%d): an all-to-all cannot run in place", a.Out, n, in, n)
		}
		c.Count = a.Count
		if wantsCopyEngine(a.Algo) {
			if h.team() == nil {
				c.Algo = core.AlgoCopyEngine // Note [Copy-engine collectives]
				c.Digest = argsDigest(argsWord(c))
				return c, nil
			}
			if a.Algo == core.AlgoCopyEngine {
				return bad("copy_engine runs on a group of one machine (the copy engines reach the mapped peers only)")
			}
		}
		if ll, _ := lowLatencyFits(h, Args{Kind: core.AllGather, Channel: a.Channel}, a.Count*es); ll && launchesKernels(h) {
			// Small chunks cross once, as lines that carry the call's
			// number (Note [Low-latency collectives]): no barrier.
			c.Algo = core.AlgoLowLatency
			c.LLOffset, c.LLSlot, c.PadAddrs = core.LowLatencyOffset(c.PadSize, world), core.LowLatencySlotBytes(), h.SignalPads
		}
		c.Digest = argsDigest(argsWord(c))
		return c, nil
	}
	v := a.V
	switch {
	case a.Algo == core.AlgoCopyEngine:
		return bad("copy_engine runs the equal-split all_to_all only: a copy's size cannot follow split sizes that live on the device")
	case v.Layout != core.A2AV && v.Layout != core.A2AV2D && v.Layout != core.A2AV2DOffset:
		return bad("unknown layout %d", int32(v.Layout))
	case v.RowBytes == 0:
		return bad("row_bytes is 0")
	case v.Experts < 1:
		return bad("experts %d is not positive", v.Experts)
	case v.Layout == core.A2AV && v.Experts != 1:
		return bad("experts %d: the plain v form has one split per rank", v.Experts)
	case world*v.Experts > core.A2AMaxSplits:
		return bad("%d ranks x %d experts = %d splits, more than %d", world, v.Experts, world*v.Experts, core.A2AMaxSplits)
	case v.Layout == core.A2AV2D && v.MajorAlign < 1:
		return bad("major_align %d is not positive", v.MajorAlign)
	case v.InSplits == 0:
		return bad("the input splits are NULL")
	case v.InSplits%8 != 0:
		return bad("the input splits %#x are not 8-byte aligned", v.InSplits)
	case v.OutSplitsOffsets == 0:
		return bad("out_splits_offsets is NULL")
	case v.OutSplitsOffsets%8 != 0:
		return bad("out_splits_offsets %#x is not 8-byte aligned", v.OutSplitsOffsets)
	case a.Out == 0 && v.OutRows > 0:
		return bad("out is NULL")
	case v.OutRows > (1<<47)/v.RowBytes:
		return bad("out_rows %d of %d bytes is too large", v.OutRows, v.RowBytes)
	}
	align := v.MajorAlign
	if v.Layout != core.A2AV2D {
		align = 0
	}
	if v.OutRows > 0 && overlap(in, room, a.Out, v.OutRows*v.RowBytes) {
		return bad("out [%#x, +%d) overlaps the input's block [%#x, +%d): an all-to-all cannot run in place", a.Out, v.OutRows*v.RowBytes, in, room)
	}
	c.V = &core.AllToAllV{Layout: v.Layout, RowBytes: v.RowBytes, Experts: v.Experts, InSplits: v.InSplits,
		OutSplitsOffsets: v.OutSplitsOffsets, InRows: room / v.RowBytes, OutRows: v.OutRows, MajorAlign: align,
		ExchangeOffset: core.A2AExchangeOffset(h.SignalPadSize, world)}
	c.Count = v.OutRows // what sizes the grid: the same on every rank, agreed below
	if a2aLowLatencyFits(h, a, c.V, in) {
		c.Algo = core.AlgoLowLatency
		c.LLOffset, c.LLSlot, c.PadAddrs = core.LowLatencyOffset(c.PadSize, world), core.LowLatencySlotBytes(), h.SignalPads
	}
	c.Digest = argsDigest(argsWord(c))
	return c, nil
}

// A2ALowLatencyMaxSplits is the most splits of a split-driven all-to-all
// on the low-latency buffers (SYMMEM_A2A_LL_MAX_SPLITS of the kernels).
const A2ALowLatencyMaxSplits = 256

// a2aLowLatencyFits says whether split-driven call a runs on the
// low-latency buffers (Note [All-to-all]): a kernel backend's channel 0,
// 8-byte rows and pointers, and an out small enough that whatever a rank
// may receive from a sender fits that sender's slot with its E header
// lines (so no valid call can pass it).
func a2aLowLatencyFits(h *target, a Args, v *core.AllToAllV, in uintptr) bool {
	ll, _ := lowLatencyFits(h, Args{Kind: core.AllGather, Channel: a.Channel}, 8)
	return ll && v.Splits(h.World) <= A2ALowLatencyMaxSplits && v.RowBytes%8 == 0 && in%8 == 0 && a.Out%8 == 0 &&
		v.OutRows <= (core.LowLatencyMaxBytes-16*uintptr(v.Experts))/v.RowBytes && core.LowLatencyMaxBytes > 16*uintptr(v.Experts)
}

// a2aWord is the packed arguments of a split-driven all-to-all for the
// agreement: its layout in argsWord's dtype bits and a 53-bit digest of
// what the ranks must agree on in its count bits.
func a2aWord(c *core.Collective) uint64 {
	v := c.V
	h := uint64(v.Layout)*0x9e3779b97f4a7c15 ^ uint64(v.RowBytes)
	h = h*0xbf58476d1ce4e5b9 ^ uint64(v.Experts)
	h = h*0x94d049bb133111eb ^ uint64(v.OutRows)
	h = h*0x9e3779b97f4a7c15 ^ uint64(v.MajorAlign)
	h ^= h >> 29
	ll := uint64(0)
	if c.Algo == core.AlgoLowLatency {
		ll = 1 << 60
	}
	return h&(1<<53-1) | uint64(core.AllToAll)&3<<53 | uint64(v.Layout)&3<<55 | 1<<59 | ll
}

// a2aSource is where split i of rank r's output comes from in the tables:
// the sender s, the index j in s's table, and the expert of r.
func a2aSource(v *core.AllToAllV, world, r, i int) (s, j int) {
	e := 0
	switch v.Layout {
	case core.A2AV2D:
		e, s = i/world, i%world
		return s, r*v.Experts + e
	case core.A2AV2DOffset:
		s, e = i/v.Experts, i%v.Experts
		return s, e*world + r
	}
	return i, r
}

// a2aTarget is where entry j of rank me's table goes: rank r, as its
// piece i (the inverse of a2aSource).
func a2aTarget(v *core.AllToAllV, world, me, j int) (r, i int) {
	switch v.Layout {
	case core.A2AV2D:
		r, e := j/v.Experts, j%v.Experts
		return r, e*world + me
	case core.A2AV2DOffset:
		r, e := j%world, j/world
		return r, me*v.Experts + e
	}
	return j, me
}

// a2aOutOffsets lays out received splits (in output order) as the layout
// says: the row offset of each, and the rows the layout takes in all.
func a2aOutOffsets(v *core.AllToAllV, world int, splits []int64) (offs []int64, total int64) {
	offs = make([]int64, len(splits))
	tile := world // A2AV2D: tiles of W splits per expert
	if v.Layout != core.A2AV2D {
		tile = len(splits)
	}
	for t := 0; t < len(splits); t += tile {
		start := total
		for i := t; i < t+tile; i++ {
			offs[i] = total
			total += splits[i]
		}
		if a := v.MajorAlign; a > 0 {
			n := (total - start + a - 1) / a * a
			total = start + max(n, a)
		}
	}
	return offs, total
}

// int64s views n int64 at addr.
func int64s(addr uintptr, n int) []int64 {
	return unsafe.Slice((*int64)(unmanaged.Pointer(addr)), n)
}

// exchangeEntry is the address of entry j of parity's exchange area in rank
// r's pad.
func (l local) exchangeEntry(c *core.Collective, r int, parity uint32, j int) *uint64 {
	return (*uint64)(unmanaged.Pointer(l.pads[r] + c.V.ExchangeOffset + uintptr(parity)*core.A2AMaxSplits*16 + uintptr(16*j)))
}

// publishTable validates this rank's split table and stores each entry
// into the exchange area of the rank it is for, for call seq (Note
// [All-to-all]).
func (l local) publishTable(c *core.Collective, seq uint32) {
	v, S := c.V, c.V.Splits(l.world)
	splits := int64s(v.InSplits, S)
	var offsets []int64
	if v.Layout == core.A2AV2DOffset {
		offsets = int64s(v.InSplits+uintptr(8*S), S)
	}
	tag, poison := a2aTag(seq), uint64(0)
	offs := make([]int64, S)
	var next int64
	for j, n := range splits {
		off := next
		if offsets != nil {
			off = offsets[j]
		}
		offs[j] = off
		next = off + n
		if n < 0 || off < 0 || n > 0 && (n > int64(v.InRows) || off > int64(v.InRows)-n) {
			poison = a2aPoison
		}
	}
	for j := range splits {
		r, i := a2aTarget(v, l.world, l.rank, j)
		e := l.exchangeEntry(c, r, seq&1, i)
		atomic.StoreUint64(e, tag|poison|uint64(splits[j])&a2aValue)
		atomic.StoreUint64((*uint64)(unsafe.Add(unsafe.Pointer(e), 8)), tag|poison|uint64(offs[j])&a2aValue)
	}
}

// readTables reads what this rank receives in call seq, from its own
// exchange area: splits and source row offsets in output order. A poisoned
// entry is an ErrInvalidArgument naming its sender; a tag of another call
// an ErrMismatch.
func (l local) readTables(c *core.Collective, seq uint32) (splits, src []int64, err error) {
	v, S := c.V, c.V.Splits(l.world)
	splits, src = make([]int64, S), make([]int64, S)
	tag := a2aTag(seq)
	for i := 0; i < S; i++ {
		s, _ := a2aSource(v, l.world, l.rank, i)
		e := l.exchangeEntry(c, l.rank, seq&1, i)
		w0 := atomic.LoadUint64(e)
		w1 := atomic.LoadUint64((*uint64)(unsafe.Add(unsafe.Pointer(e), 8)))
		switch {
		case w0&^(a2aPoison|a2aValue) != tag || w1&^(a2aPoison|a2aValue) != tag:
			return nil, nil, core.Errorf(core.ErrMismatch, "group %q: rank %d: rank %d's %s splits are of another call (call %d here): the ranks are a call apart",
				l.h.GroupName, l.global(l.rank), l.global(s), v.Layout, seq)
		case w0&a2aPoison != 0:
			return nil, nil, core.Errorf(core.ErrInvalidArgument, "group %q: %s: rank %d's splits overrun its input (a negative split, or rows past the %d its buffer holds): nothing was moved",
				l.h.GroupName, v.Layout, l.global(s), v.InRows)
		}
		splits[i], src[i] = int64(w0&a2aValue), int64(w1&a2aValue)
	}
	return splits, src, nil
}

// runHostAllToAll runs all-to-all c on this thread (a CPU-addressable
// backend), as the kernel does (Note [All-to-all]).
func (l local) runHostAllToAll(c *core.Collective) error {
	deadline := time.Now().Add(l.h.Timeout)
	set := c.Channel * core.CollMaxBlocks
	seqWord := l.regionWord(l.rank, 6)
	seq := atomic.LoadUint32(seqWord)
	defer atomic.StoreUint32(seqWord, seq+1)
	if c.V != nil {
		l.publishTable(c, seq)
	}
	if err := l.openHost(c, set, deadline); err != nil {
		return err
	}
	var err error
	if c.V == nil {
		n := c.Count * c.DType.Size()
		for k := 0; k < l.world; k++ {
			s := (l.rank + k) % l.world
			copy(bytesAt(c.Out+uintptr(s)*n, n), bytesAt(l.bufs[s]+c.InOffset+uintptr(l.rank)*n, n))
		}
	} else {
		err = l.moveRows(c, seq)
	}
	if berr := l.hostBarrier(set, deadline); berr != nil {
		return berr
	}
	return err
}

// moveRows is the split-driven all-to-all's work once the tables are
// published: read them, write OutSplitsOffsets, move the rows unless that
// would overrun.
func (l local) moveRows(c *core.Collective, seq uint32) error {
	v, S := c.V, c.V.Splits(l.world)
	splits, src, err := l.readTables(c, seq)
	if err != nil {
		return err
	}
	offs, total := a2aOutOffsets(v, l.world, splits)
	out := int64s(v.OutSplitsOffsets, 2*S)
	copy(out, splits)
	copy(out[S:], offs)
	if total > int64(v.OutRows) {
		return core.Errorf(core.ErrInvalidArgument, "group %q: %s: rank %d receives %d rows (as laid out), more than the %d out holds: nothing was moved",
			l.h.GroupName, v.Layout, l.global(l.rank), total, v.OutRows)
	}
	rb := v.RowBytes
	for i := 0; i < S; i++ {
		s, _ := a2aSource(v, l.world, l.rank, i)
		n := uintptr(splits[i]) * rb
		copy(bytesAt(c.Out+uintptr(offs[i])*rb, n), bytesAt(l.bufs[s]+c.InOffset+uintptr(src[i])*rb, n))
	}
	return nil
}

// a2aText names an all-to-all's packed arguments.
func a2aText(w uint64) string {
	if w>>59&7 == 0 {
		ce := ""
		if w>>57&3 == 1 {
			ce = ", copy_engine"
		}
		return fmt.Sprintf("all_to_all(%s, count %d%s)", core.DType(w>>55&3), w&(1<<53-1), ce)
	}
	path := ""
	if w>>60&1 != 0 {
		path = ", low_latency"
	}
	return fmt.Sprintf("%s(arguments %#x%s)", core.A2ALayout(w>>55&3), w&(1<<53-1), path)
}
