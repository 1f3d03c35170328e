package coll

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/libsymmem/libsymmem/core"
)

// Note [Copy-engine collectives]
//
// AlgoCopyEngine moves a collective's bytes with the GPUs' copy engines
// rather than with SM loads and stores, so that a collective beside a
// matmul leaves the matmul its SMs, and an all-gather runs at the peer-copy
// rate. Every rank pulls: it copies what it needs from the peers' blocks
// (mapped in this process: the description's Buffers) with one copy per peer chunk
// (CopyEngineRunner.CopiesAsync, cuMemcpyAsync; the copies of one call
// run at once, each on a stream of its own beside the caller's), and
// writes only its own memory:
//
//	all_gather      rank q's input to out + q*count, q = me, me+1, ...
//	                (in place: our own part is not copied)
//	all_to_all      chunk me of rank s's input to out + s*count (equal
//	                splits; the v forms' sizes live on the device, which a
//	                copy's size cannot follow: refused)
//	reduce_scatter  slice me of every peer's input into a scratch of this
//	                rank, then a small kernel (SYMMEM_CE_REDUCE_BLOCKS
//	                blocks, 16) reduces the slices and our own, in rank
//	                order, into out
//	all_reduce      every peer's whole input into the scratch, then the
//	                same kernel over the whole count (one-shot's bytes:
//	                (W-1)*n per rank, the same as two-shot's at W = 2)
//
// Copy engines cannot reduce, hence the scratch and the kernel; the
// results are one-shot's, bit for bit (the same reduction in rank order).
//
// Ordering. An opening barrier before the copies (the peers' inputs are
// written), a closing one after the work (the peers are done reading our
// input, so the caller may overwrite it once the stream passes). An
// all-reduce in place has a middle barrier instead of the closing one:
// every peer's pull of our input must be done before the reduction
// overwrites it, and after that barrier nobody reads it. On a stream the
// barriers are stream memory operations (cuStreamBatchMemOp: the GPU's
// front end runs them, no kernel) on flags of their own in the pads
// (core.CopyEngineFlag, Note [Pad partition] in core): rank p arrives by
// storing a value into its flag in every peer's pad; it waits until each
// peer's flag in its own pad holds the value, and clears it (stores 0).
// The values are constants, so a CUDA graph that captures a call replays
// it unchanged. Why a flag is never set twice before it is cleared: p
// sets flag (phase, p) in our pad again only in its next call's same
// phase, after it has passed another barrier of ours, whose arrival we
// make after our clear of the flag (stream order, and a stream write
// orders the writes before it). The opening value carries the call's
// argument digest (0x80000000 | digest): ranks that disagree never see
// the value they wait for. On the host backend the same steps run on the
// calling thread with the host runner's barriers and argument agreement
// (memcpy as the copy engine).
//
// Bounds. A stream's wait on a value has no timeout (the GPU's front end
// waits for ever, and a kernel-side bounded wait would need an SM slot,
// which a matmul that fills every SM may hold until it ends: the stall the
// mode exists to avoid). So the host bounds the calls it enqueues: each
// call ends with a stream store of its number into a pinned host word of
// its (group, channel), and a watchdog (one timer per group and channel)
// looks at that word once the group's timeout has passed since the
// oldest unfinished call was enqueued. A call still unfinished then has
// failed: the watchdog reads our flags to say why (a peer's opening flag
// with another digest: the ranks called different collectives; else the
// ranks whose flag never came), stops the group's collectives (our stop
// word's pinned mirror, and the stop words in the pads for the kernels:
// Note [Failed collectives]) so that the next call on the group fails
// naming it, and stores the awaited values into our flags so that the
// stream moves on (what the call wrote to out is undefined), again every
// few milliseconds until every call enqueued before has passed (the
// handle stays entered meanwhile, bounded by the timeout). Then it stores
// ceGaveUpValue into our opening flag in every peer's pad: a late peer's
// call, which a peer's stop word in device memory cannot refuse (no
// kernel reads it), would otherwise find our released call's arrivals and
// pass; it waits instead, and its own watchdog names us. A call
// captured into a CUDA graph has no host-side entry when it is replayed,
// so the watchdog does not see it: a replay that a peer never answers
// blocks its stream until the watchdog of an eager call enqueued after it
// on the channel gives up (its release passes the replay's waits too when
// the arguments are the same), or for good. The abort word, which kernels
// read, does not reach a stream's wait.
//
// Cost and choice: every chunk is one copy, and the copies of one call run
// at once, each on a stream of its own beside the caller's (forked after
// the opening barrier and joined before what follows it: CopiesAsync), so
// a rank's own chunk and every peer's cross at the same time, each link
// on its own copy engine; peers pull from each other at once, which is
// what keeps both directions of every link busy. auto picks the mode for
// an all-gather of at least CopyEngineAllGatherMinBytes per rank in a
// group of 2 ranks of one machine, called outside CUDA-graph capture
// (autoCopyEngine), where it was measured faster than the SM kernel
// (bench/ce_bench.py on 2 x H200, the copies then in stream order:
// 874-875 us against 951 us at 256 MiB, even at 64 MiB); with more ranks
// it keeps the SM kernel, which has no figure against the copy engines
// there yet. Captured calls keep the SM kernel, whose waits are bounded
// on the device: a captured copy-engine call has no watchdog (above). The
// reductions on the copy engines are slower than the SM kernels at every
// size (2.7x at 256 MiB: the kernel of a few blocks reduces at a fraction
// of HBM speed), so auto never picks them.
// SYMMEM_LEAVE_SMS=1 makes auto pick the mode for every call of a group
// of one machine. The scratch of a (group, channel) only grows and is never
// given back while the process lives: a captured graph may still read it.

// LeaveSMs says whether AlgoAuto runs every collective of a group of one
// machine on the copy engines (SYMMEM_LEAVE_SMS).
var LeaveSMs = core.Current().Bool("SYMMEM_LEAVE_SMS", false)

// wantsCopyEngine says whether algo a runs on the copy engines.
func wantsCopyEngine(a core.Algo) bool {
	return a == core.AlgoCopyEngine || a == core.AlgoAuto && LeaveSMs
}

// CopyEngineAllGatherMinBytes is the smallest all-gather (bytes of each
// rank's input) that auto runs on the copy engines in a group of 2 ranks
// (Note [Copy-engine collectives]).
var CopyEngineAllGatherMinBytes = uintptr(core.Current().Size("SYMMEM_CE_ALL_GATHER_MIN_BYTES", 128<<20))

// autoCopyEngine says whether auto runs a on the copy engines by size:
// an all-gather of at least CopyEngineAllGatherMinBytes per rank in a
// group of 2, on a backend with copy engines on streams, outside
// CUDA-graph capture. Every rank decides alike (count and world are
// agreed; a rank that captures where its peer does not meets the other
// protocol, and both calls fail when their bounded waits end).
func autoCopyEngine(h *target, a Args, inBytes uintptr) bool {
	if a.Algo != core.AlgoAuto || a.Kind != core.AllGather || h.World != 2 || inBytes < CopyEngineAllGatherMinBytes {
		return false
	}
	ce, ok := h.Backend.(core.CopyEngineRunner)
	if !ok || !h.Backend.Capabilities().StreamSignals {
		return false
	}
	capturing, err := ce.Capturing(h.Device, a.Stream)
	return err == nil && !capturing
}

// ceMaxWorld is the most ranks of a copy-engine reduction (the reduction
// kernel takes every source's pointer in its parameters).
const ceMaxWorld = 64

// ceSource is where a piece of a copy-engine call lies: an address, or
// (addr 0) scratch slot slot.
type ceSource struct {
	addr uintptr
	slot int
}

// cePull is one copy of a copy-engine call.
type cePull struct {
	dst ceSource
	src uintptr
	n   uintptr
}

// cePlan is what a copy-engine call does between its opening and closing
// barriers (Note [Copy-engine collectives]).
type cePlan struct {
	pulls []cePull
	// slotBytes is the size of one scratch slot (W-1 slots).
	slotBytes uintptr
	// middle: a middle barrier after the pulls and no closing one.
	middle bool
	// reduce, when set, reduces count elements of srcs into out after
	// the pulls (and the middle barrier).
	srcs       []ceSource
	out, count uintptr
}

// planCopyEngine is c's copy-engine plan over the view.
func (l local) planCopyEngine(c *core.Collective) cePlan {
	me, w := l.rank, l.world
	es := c.DType.Size()
	slot := func(q int) ceSource {
		if q > me {
			q--
		}
		return ceSource{slot: q}
	}
	var p cePlan
	switch c.Kind {
	case core.AllGather:
		n := c.Count * es
		for k := 0; k < w; k++ {
			q := (me + k) % w
			src := l.bufs[q] + c.InOffset
			if c.SlicedInput {
				src += uintptr(q) * n
			}
			if dst := c.Out + uintptr(q)*n; dst != src {
				p.pulls = append(p.pulls, cePull{dst: ceSource{addr: dst}, src: src, n: n})
			}
		}
	case core.AllToAll:
		n := c.Count * es
		for k := 0; k < w; k++ {
			s := (me + k) % w
			p.pulls = append(p.pulls, cePull{dst: ceSource{addr: c.Out + uintptr(s)*n}, src: l.bufs[s] + c.InOffset + uintptr(me)*n, n: n})
		}
	case core.ReduceScatter:
		per := c.Count / uintptr(w)
		m := per * es
		p.slotBytes, p.out, p.count = m, c.Out, per
		for k := 1; k < w; k++ {
			q := (me + k) % w
			p.pulls = append(p.pulls, cePull{dst: slot(q), src: l.bufs[q] + c.InOffset + uintptr(me)*m, n: m})
		}
		for r := 0; r < w; r++ {
			if r == me {
				p.srcs = append(p.srcs, ceSource{addr: l.bufs[me] + c.InOffset + uintptr(me)*m})
			} else {
				p.srcs = append(p.srcs, slot(r))
			}
		}
	default: // all_reduce
		n := c.Count * es
		p.slotBytes, p.out, p.count = n, c.Out, c.Count
		p.middle = c.Out == l.bufs[me]+c.InOffset
		for k := 1; k < w; k++ {
			q := (me + k) % w
			p.pulls = append(p.pulls, cePull{dst: slot(q), src: l.bufs[q] + c.InOffset, n: n})
		}
		for r := 0; r < w; r++ {
			if r == me {
				p.srcs = append(p.srcs, ceSource{addr: l.bufs[me] + c.InOffset})
			} else {
				p.srcs = append(p.srcs, slot(r))
			}
		}
	}
	return p
}

// runCopyEngine runs copy-engine collective c of the view: on stream s
// where the backend has copy engines, on this thread over CPU memory.
func (l local) runCopyEngine(c *core.Collective, s core.Stream) error {
	be, device := l.h.Backend, l.h.Device
	if !be.Capabilities().StreamSignals {
		mu := &l.h.state().channels[c.Channel]
		mu.Lock()
		defer mu.Unlock()
		return l.runHostCopyEngine(c)
	}
	ce, ok := be.(core.CopyEngineRunner)
	if !ok {
		return core.Errorf(core.ErrUnavailable, "group %q: %s: the %s backend has no copy engines (copy_engine needs the cuda backend or CPU memory)", l.h.GroupName, c.Kind, be.Name())
	}
	if c.Kind == core.AllReduce || c.Kind == core.ReduceScatter {
		if l.world > ceMaxWorld {
			return core.Errorf(core.ErrUnavailable, "group %q: %s: copy_engine reduces over at most %d ranks (the group has %d)", l.h.GroupName, c.Kind, ceMaxWorld, l.world)
		}
	}
	return l.runStreamCopyEngine(be, ce, device, c, s)
}

// runHostCopyEngine runs c on this thread over CPU memory, in the steps
// and order of the stream form (Note [Copy-engine collectives]), with the
// host runner's barriers and argument agreement.
func (l local) runHostCopyEngine(c *core.Collective) error {
	deadline := time.Now().Add(l.h.Timeout)
	set := c.Channel * core.CollMaxBlocks
	if err := l.openHost(c, set, deadline); err != nil {
		return err
	}
	p := l.planCopyEngine(c)
	slots := make([][]byte, l.world-1)
	for i := range slots {
		slots[i] = make([]byte, p.slotBytes)
	}
	for _, q := range p.pulls {
		src := bytesAt(q.src, q.n)
		if q.dst.addr != 0 {
			copy(bytesAt(q.dst.addr, q.n), src)
		} else {
			copy(slots[q.dst.slot], src)
		}
	}
	if p.middle {
		if err := l.hostBarrier(set, deadline); err != nil {
			return err
		}
	}
	if p.srcs != nil {
		srcs := make([][]byte, len(p.srcs))
		n := p.count * c.DType.Size()
		for i, s := range p.srcs {
			if s.addr != 0 {
				srcs[i] = bytesAt(s.addr, n)
			} else {
				srcs[i] = slots[s.slot][:n]
			}
		}
		copy(bytesAt(p.out, n), reduceBytes(c.DType, c.Op, srcs))
	}
	if p.middle {
		return nil
	}
	return l.hostBarrier(set, deadline)
}

// reduceBytes reduces the equal-length element arrays srcs, in their
// order, as Reduce does (fp32 accumulation for 16-bit types, one rounding).
func reduceBytes(dt core.DType, op core.ReduceOp, srcs [][]byte) []byte {
	le := binary.LittleEndian
	out := make([]byte, len(srcs[0]))
	es := int(dt.Size())
	for i := 0; i < len(out); i += es {
		if dt == core.Int32 {
			acc := int32(le.Uint32(srcs[0][i:]))
			for _, s := range srcs[1:] {
				acc = ReduceInt(op, acc, int32(le.Uint32(s[i:])))
			}
			le.PutUint32(out[i:], uint32(acc))
			continue
		}
		acc := floatAt(dt, srcs[0][i:])
		for _, s := range srcs[1:] {
			acc = ReduceFloat(op, acc, floatAt(dt, s[i:]))
		}
		PutFloat(dt, out[i:], acc)
	}
	return out
}

// floatAt widens the element of dt at the start of b.
func floatAt(dt core.DType, b []byte) float32 {
	le := binary.LittleEndian
	switch dt {
	case core.Float16:
		return F16ToFloat(le.Uint16(b))
	case core.BFloat16:
		return BF16ToFloat(le.Uint16(b))
	}
	return math.Float32frombits(le.Uint32(b))
}

// ceOpenValue is the opening flag's value of a call with digest d: never
// 0 (a cleared flag), the digest's low 31 bits.
func ceOpenValue(d uint32) uint32 { return 0x80000000 | d&0x7fffffff }

// ceFlagValue is the value of phase's flag for a call with digest d.
func ceFlagValue(phase int, d uint32) uint32 {
	if phase == ceOpen {
		return ceOpenValue(d)
	}
	return 1
}

// The barrier phases of a copy-engine call (core.CopyEngineFlag).
const (
	ceOpen   = 0
	ceMiddle = 1
	ceClose  = 2
)

// ceBarrierOps are a stream barrier's operations for phase: the arrivals
// in every peer's pad, then for each peer the wait for its flag in ours
// and the flag's clear.
func (l local) ceBarrierOps(c *core.Collective, phase int) (puts, waits []core.MemOp) {
	ps := l.h.SignalPadSize
	v := ceFlagValue(phase, c.Digest)
	for k := 1; k < l.world; k++ {
		p := (l.rank + k) % l.world
		puts = append(puts, core.MemOp{Addr: l.pads[p] + core.CopyEngineFlag(ps, l.world, c.Channel, phase, l.rank), Value: v})
		mine := l.pads[l.rank] + core.CopyEngineFlag(ps, l.world, c.Channel, phase, p)
		waits = append(waits, core.MemOp{Addr: mine, Value: v, Wait: true}, core.MemOp{Addr: mine})
	}
	return puts, waits
}

// runStreamCopyEngine enqueues c on s: barriers as stream memory
// operations, copies on the copy engines, the reduction kernel; then the
// call's number into the watchdog's word (Note [Copy-engine collectives]).
func (l local) runStreamCopyEngine(be core.Backend, ce core.CopyEngineRunner, device int, c *core.Collective, s core.Stream) error {
	st, err := ceStateFor(l, device, c.Channel)
	if err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	p := l.planCopyEngine(c)
	stride := (p.slotBytes + 255) &^ 255
	capturing, err := ce.Capturing(device, s)
	if err != nil {
		return err
	}
	if p.srcs != nil {
		// The kernel and the scratch first: nothing is enqueued when
		// either cannot be had.
		if err := ce.LaunchLocalReduce(device, s, c.DType, c.Op, []uintptr{0}, 0, 0); err != nil {
			return core.Errorf(core.CodeOf(err), "group %q: %s: copy_engine reduces with a kernel, which cannot be had: %v", l.h.GroupName, c.Kind, err)
		}
		need := stride * uintptr(l.world-1)
		if capturing && st.scratchBytes < need {
			return core.Errorf(core.ErrInvalidState, "group %q: %s: copy_engine needs a scratch of %d bytes on channel %d (it holds %d), which cannot be made inside a CUDA-graph capture: run the call once before capturing",
				l.h.GroupName, c.Kind, need, c.Channel, st.scratchBytes)
		}
		if err := st.ensureScratch(be, device, need); err != nil {
			return core.Errorf(core.CodeOf(err), "group %q: %s: the copy engines' scratch of %d bytes: %v", l.h.GroupName, c.Kind, need, err)
		}
	}
	at := func(x ceSource) uintptr {
		if x.addr != 0 {
			return x.addr
		}
		return st.scratch + uintptr(x.slot)*stride
	}
	timeout := l.h.Timeout
	enqueued := false
	fail := func(what string, err error) error {
		if !enqueued {
			return err
		}
		return core.Errorf(core.CodeOf(err), "group %q: rank %d: %s: %s failed after part of the call was enqueued on the stream: %v; the group's copy-engine barriers on channel %d are out of step (abort and destroy the group, then create a new one)",
			l.h.GroupName, l.global(l.rank), c.Kind, what, err, c.Channel)
	}
	barrier := func(phase int) error {
		if l.world == 1 {
			return nil
		}
		puts, waits := l.ceBarrierOps(c, phase)
		if err := be.StreamMemOps(device, s, puts, timeout); err != nil {
			return fail("a barrier's arrivals", err)
		}
		enqueued = true
		if err := be.StreamMemOps(device, s, waits, timeout); err != nil {
			return fail("a barrier's waits", err)
		}
		return nil
	}
	if err := barrier(ceOpen); err != nil {
		return err
	}
	if len(p.pulls) > 0 {
		copies := make([]core.Copy, len(p.pulls))
		for i, q := range p.pulls {
			copies[i] = core.Copy{Dst: at(q.dst), Src: q.src, N: q.n}
		}
		if err := ce.CopiesAsync(device, s, copies); err != nil {
			return fail("the copies", err)
		}
		enqueued = true
	}
	if p.middle {
		if err := barrier(ceMiddle); err != nil {
			return err
		}
	}
	if p.srcs != nil {
		srcs := make([]uintptr, len(p.srcs))
		for i, x := range p.srcs {
			srcs[i] = at(x)
		}
		if err := ce.LaunchLocalReduce(device, s, c.DType, c.Op, srcs, p.out, p.count); err != nil {
			return fail("the reduction kernel", err)
		}
		enqueued = true
	}
	if !p.middle {
		if err := barrier(ceClose); err != nil {
			return err
		}
	}
	if capturing || st.done == 0 {
		return nil
	}
	st.seq++
	if err := be.StreamMemOps(device, s, []core.MemOp{{Addr: st.done, Value: st.seq}}, timeout); err != nil {
		return fail("the call's completion word", err)
	}
	st.watch(l, c, st.seq)
	return nil
}
