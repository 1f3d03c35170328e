package symm

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/ipc"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// Note [Signals]
//
// Slot channel*world + sender of the receiver's pad is a 32-bit count: how
// many signals the sender has put to the receiver on that channel, modulo
// 2^32. Only the sender writes the slot, and only upward; the receiver only
// reads it. Each rank remembers per (peer, channel) how many signals it has
// put (sent) and how many it has waited for (seen): its k-th wait for src on
// a channel returns once src's count there has reached k, compared as
// int32(count-k) >= 0 so that wrap-around does not matter. Each (sender,
// receiver, channel) is thus a counting semaphore, as NVSHMEM's signal-add /
// wait-until-at-least pair: a put never waits, no signal is lost, several
// may be in flight, and each wait consumes exactly one.
//
// Host backend: a put is an atomic add of 1 on the slot, so puts from several
// threads cannot lower the count; a wait takes its number k from seen with an
// atomic add and polls the slot on the calling thread until the deadline; a
// wait that times out gives its number back. All of it is sequentially
// consistent, so stores made before a put are visible after the matching
// wait.
//
// cuda backend: a put is a stream write of sent+1 into the peer's slot (flags
// 0: after the stream's earlier work, with a memory barrier), a wait a stream
// wait for seen+1 (CU_STREAM_WAIT_VALUE_GEQ) on our own pad, and a barrier
// world-1 writes then world-1 waits, none of them a remote poll. The barrier
// enqueues the writes with one cuStreamBatchMemOp and the waits with another:
// on two H200 a barrier took 4.0-4.4 µs of GPU time that way and 4.6-5.2 µs
// as one batch of both (the 0/1 protocol this replaced, with a remote poll
// and a clear per peer, 7.9-9.8 µs; bench/stream_signal_bench.cu); a batch of
// more than one operation costs the GPU more than one of a single operation.
// Numbers are taken and the operations enqueued under
// signalCounts.mu, so they reach the driver in increasing order; they run in
// that order when the puts to one (peer, channel) go to one stream or to
// streams the caller orders. The GPU does not bound its waits: the host-side
// waits that follow (stream or device synchronisation) carry the timeout.
//
// The counts start at 0 with the pads (zeroed when the group makes them) and
// live as long as the group's memory; every handle of the group shares them.
// After a failed call (a driver error, a timeout on one of several waits) the
// counts of the channel it used may disagree between ranks: use another
// channel or another group.

// slot is the address of the count for (receiver, sender, channel).
func (h *Handle) slot(receiver, sender, channel int) uintptr {
	return h.padPtrs[receiver] + uintptr(4*(channel*h.world+sender))
}

func (h *Handle) timeoutOr(t time.Duration) time.Duration {
	if t <= 0 {
		return h.timeout
	}
	return t
}

func (h *Handle) onStreams() bool { return h.gm.be.Capabilities().StreamSignals }

// checkSignal admits a signal call (the caller defers h.life.leave() when
// it returns nil) and checks its arguments.
func (h *Handle) checkSignal(peerWhat string, peer, channel int) error {
	if err := h.enter(); err != nil {
		return err
	}
	err := h.checkRank(peerWhat, peer)
	if err == nil {
		err = h.checkChannel(channel)
	}
	if err != nil {
		h.life.leave()
	}
	return err
}

// PutSignal adds one to our count in dst's pad on channel: at once on the
// host backend, in stream order on s on cuda. It never waits for dst.
// timeout only bounds the enqueueing (nothing waits on a put).
func (h *Handle) PutSignal(dst, channel int, s core.Stream, timeout time.Duration) error {
	if err := h.checkSignal("destination rank", dst, channel); err != nil {
		return err
	}
	defer h.life.leave()
	if h.span != nil && !h.span.sameTeam(h.rank, dst) {
		return h.span.putRemote(dst, channel, s)
	}
	if h.onStreams() {
		return h.streamSignals(s, h.timeoutOr(timeout), channel, []int{dst}, nil)
	}
	h.putHost(dst, channel)
	return nil
}

// WaitSignal consumes one signal from src on channel: it waits until src's
// count in our pad has reached the number of waits made so far, this one
// included. On the host backend it waits on this thread, up to timeout (<= 0:
// the group's); on cuda it enqueues the wait on s.
func (h *Handle) WaitSignal(src, channel int, s core.Stream, timeout time.Duration) error {
	if err := h.checkSignal("source rank", src, channel); err != nil {
		return err
	}
	defer h.life.leave()
	timeout = h.timeoutOr(timeout)
	if h.span != nil && !h.span.sameTeam(h.rank, src) {
		return h.span.waitRemote(src, channel, s)
	}
	if h.onStreams() {
		return h.streamSignals(s, timeout, channel, nil, []int{src})
	}
	switch h.waitHost(src, channel, time.Now().Add(timeout), false) {
	case waitReleased:
		return h.releasedDuring(fmt.Sprintf("a wait for rank %d's signal on channel %d", src, channel))
	case waitAborted:
		return h.gm.abortedErr(fmt.Sprintf("a wait for rank %d's signal on channel %d", src, channel))
	case waitInterrupted:
		return h.interruptedWait(fmt.Sprintf("wait for rank %d's signal on channel %d", src, channel))
	case waitPeerExited:
		return h.gm.live.Exited(src, fmt.Sprintf("rank %d's wait for its signal on channel %d", h.rank, channel))
	case waitTimedOut:
		return core.Errorf(core.ErrTimeout, "group %q: rank %d timed out after %v waiting for rank %d's signal on channel %d",
			h.name, h.rank, timeout, src, channel)
	}
	return nil
}

// streamSignals enqueues on s, under the counts' lock, a put to each rank of
// dsts (one driver call), then a wait for each rank of srcs (another), on
// channel, and counts each batch once it is enqueued (Note [Signals]: one
// batch holding both ran slower on the GPU).
func (h *Handle) streamSignals(s core.Stream, timeout time.Duration, channel int, dsts, srcs []int) error {
	c := h.sig
	c.mu.Lock()
	defer c.mu.Unlock()
	ops := c.scratchOps(len(dsts) + len(srcs))
	puts, waits := ops[:len(dsts)], ops[len(dsts):]
	for i, dst := range dsts {
		puts[i] = core.MemOp{Addr: h.slot(dst, h.rank, channel), Value: c.sent[c.index(dst, channel)] + 1}
	}
	for i, src := range srcs {
		waits[i] = core.MemOp{Addr: h.slot(h.rank, src, channel), Value: c.seen[c.index(src, channel)] + 1, Wait: true, AtLeast: true}
	}
	if k, ok := h.gm.be.(core.KernelMemOps); ok && signalKernels {
		peers := append(append(c.peers[:0], dsts...), srcs...)
		c.peers = peers
		err := k.LaunchMemOps(h.gm.device, s, ops, core.MemOpWatch{TimeoutNs: uint64(timeout.Nanoseconds()),
			Flag: h.padPtrs[h.rank] + h.padSize, Abort: h.padPtrs[h.rank] + h.padSize + 4, Peers: peers})
		if err == nil {
			for _, dst := range dsts {
				c.sent[c.index(dst, channel)]++
			}
			for _, src := range srcs {
				c.seen[c.index(src, channel)]++
			}
			return nil
		}
		if core.CodeOf(err) != core.ErrUnavailable {
			return err
		}
	}
	if len(puts) > 0 {
		if err := h.gm.be.StreamMemOps(h.gm.device, s, puts, timeout); err != nil {
			return err
		}
		for _, dst := range dsts {
			c.sent[c.index(dst, channel)]++
		}
	}
	if len(waits) > 0 {
		if err := h.gm.be.StreamMemOps(h.gm.device, s, waits, timeout); err != nil {
			return err
		}
		for _, src := range srcs {
			c.seen[c.index(src, channel)]++
		}
	}
	return nil
}

// Note [Signals as a kernel]
//
// On a stream, a signal is a 32-bit store of the next count into the
// receiver's slot and a wait is a poll of our slot until the sender's count
// has reached the one we expect (the counts are kept here, Note
// [Signals]). cuStreamBatchMemOp runs those on the stream's front end: its
// waits have no bound (a dead peer blocks the stream for good) and a
// barrier measured 9.6 us at 4 ranks of H200 against 6.9 for torch's
// barrier kernel. Where the backend can (core.KernelMemOps: cuda with
// NVRTC), the same stores and polls run as one small kernel, a thread per
// operation: launched with programmatic dependent launch, so its launch
// overlaps the previous kernel's tail, and bounded by the call's timeout
// and the abort word, a wait that gives up recording the rank it waited
// for in the device error flag (set 0xffff: not a collective's). The
// values are the same as the memory operations', so a CUDA graph that
// captures either replays the same counts. SYMMEM_SIGNAL_KERNEL=0 keeps
// the memory operations.

// signalKernels says whether stream signals run as a kernel where the
// backend can (SYMMEM_SIGNAL_KERNEL, on).
var signalKernels = core.Current().Bool("SYMMEM_SIGNAL_KERNEL", true)

// putHost adds one to our count in dst's pad on channel (host backend).
func (h *Handle) putHost(dst, channel int) {
	atomic.AddUint32((*uint32)(unmanaged.Pointer(h.slot(dst, h.rank, channel))), 1)
}

// waitOutcome is how a host-side wait ended.
type waitOutcome int

const (
	waitReached     waitOutcome = iota
	waitTimedOut                // the deadline passed
	waitReleased                // the handle was released meanwhile (Note [Calls in flight])
	waitPeerExited              // the peer's process exited (Note [Dead peers] in core/ipc)
	waitAborted                 // the group was aborted (Note [Abort])
	waitInterrupted             // a signal came (Note [Interrupts] in core)
)

// waitHost takes the next number for (src, channel) and polls src's count in
// our pad until it reaches that number, the deadline passes, src's process
// exits or the handle is released; unless reached, it gives the number back
// (a signal wait), or keeps it when keep is set (a barrier's wait: Note
// [Barriers that fail]).
func (h *Handle) waitHost(src, channel int, deadline time.Time, keep bool) waitOutcome {
	c := h.sig
	seen := &c.seen[c.index(src, channel)]
	n := atomic.AddUint32(seen, 1)
	giveBack := ^uint32(0)
	if keep {
		giveBack = 0
	}
	word := (*uint32)(unmanaged.Pointer(h.slot(h.rank, src, channel)))
	mark := core.InterruptMark()
	sleep := time.Microsecond
	var rep *core.WaitReport // made when the wait becomes long (not on the fast path)
	var checked time.Time    // when src's process was last checked
	for i := 0; ; i++ {
		if core.Reached(atomic.LoadUint32(word), n) {
			return waitReached
		}
		switch {
		case i < 100:
		case i < 300:
			runtime.Gosched()
		default:
			if h.life.closed() {
				atomic.AddUint32(seen, giveBack)
				return waitReleased
			}
			select {
			case <-h.gm.abort.ch:
				atomic.AddUint32(seen, giveBack)
				return waitAborted
			default:
			}
			if core.InterruptedSince(mark) {
				atomic.AddUint32(seen, giveBack)
				return waitInterrupted
			}
			now := time.Now()
			if !now.Before(deadline) {
				atomic.AddUint32(seen, giveBack)
				return waitTimedOut
			}
			if h.peerExited(src, now, &checked) && !core.Reached(atomic.LoadUint32(word), n) {
				atomic.AddUint32(seen, giveBack)
				return waitPeerExited
			}
			if i == 300 {
				rep = core.StartWait(h.name, h.rank, fmt.Sprintf("signal %d on channel %d", n, channel), deadline)
			}
			rep.Tick(func() string { return fmt.Sprintf("rank %d", src) })
			core.Nap(sleep)
			if sleep < 100*time.Microsecond {
				sleep *= 2
			}
		}
	}
}

// peerExited reports whether rank r's process has exited, checking at most
// every ipc.LivenessCheckEvery (checked is when it last did; Note [Dead
// peers] in core/ipc). Callers read the awaited count once more after a
// true, so that a peer that arrived and then exited is not reported.
func (h *Handle) peerExited(r int, now time.Time, checked *time.Time) bool {
	if now.Sub(*checked) < ipc.LivenessCheckEvery {
		return false
	}
	*checked = now
	return h.gm.live.Gone(r)
}

// releasedDuring is the error of a wait cut short by Release.
func (h *Handle) releasedDuring(what string) error {
	return core.Errorf(core.ErrInvalidState, "group %q: rank %d: the handle was released on another thread during %s", h.name, h.rank, what)
}

// Note [Barrier at more ranks]
//
// The linear barrier is world-1 puts then world-1 waits. On the GPU each
// stream memory operation costs the stream's front end about 2 µs whatever
// the peer (2 H200: 4.6 µs at 2 ranks; 4 H200: 8.9 µs at 4, against 6.6 µs
// for torch's one-kernel barrier), so it grows linearly with the world.
// The dissemination barrier (Hensgen, Finkel and Manber) takes
// ceil(log2(world)) rounds; in round k each rank puts to rank+2^k and waits
// for rank-2^k: 2 operations per round, 4 at 4 ranks instead of 6, 6 at 8
// instead of 14, but each round waits for the previous one (one peer's
// latency per round instead of one for all). The distances 2^k are distinct
// modulo world, so each (sender, receiver) pair carries at most one signal
// per barrier and the counting semaphores of Note [Signals] keep successive
// barriers apart. Which is faster where is measured, not assumed:
// SYMMEM_BARRIER=linear|dissemination selects it (every rank alike; the
// default is linear), and bench/symm_bench.py reports both at each world
// size it runs. (CUDA 13.1 adds atomic-add stream operations: a barrier of
// world-1 remote adds and a single wait, not available on the 13.0 driver
// of the machines measured so far.)

// Barrier returns (or, on a stream, lets the stream go on) once every rank
// has entered it: a signal to every peer on channel and one from every
// peer, directly or through the dissemination rounds (Note [Barrier at more
// ranks]). timeout <= 0 means the group's; it bounds the whole barrier.
func (h *Handle) Barrier(channel int, s core.Stream, timeout time.Duration) error {
	if err := h.checkSignal("rank", h.rank, channel); err != nil {
		return err
	}
	defer h.life.leave()
	timeout = h.timeoutOr(timeout)
	if h.span != nil {
		return h.spanBarrier(channel, s, timeout)
	}
	steps, froms := h.barrierDsts, h.barrierSrcs
	if h.onStreams() {
		for i := range steps {
			if err := h.streamSignals(s, timeout, channel, steps[i], froms[i]); err != nil {
				return err
			}
		}
		return nil
	}
	deadline := time.Now().Add(timeout)
	for i := range steps {
		if err := h.hostStep(channel, steps[i], froms[i], deadline, timeout); err != nil {
			// Note [Barriers that fail]: the waits of the rounds left
			// take their numbers; their signals are not put.
			for j := i + 1; j < len(steps); j++ {
				h.skipWaits(channel, froms[j])
			}
			return err
		}
	}
	return nil
}

// Note [Barriers that fail]
//
// A barrier is a signal to every peer and a wait for one from every peer
// (Note [Signals]); on a channel the k-th barrier of each rank must meet
// the k-th of every other. A host-side barrier whose wait gives up (a
// timeout, a peer's exit, an abort, a release) has put its signals, which
// cannot be taken back: a late peer finds them. Were the wait's number
// given back, as a lone signal wait gives it back, this rank's next
// barrier would be met by the late peer's signal of the failed one, and
// from then on this rank would pass every barrier one barrier ahead of its
// peers, with success. So a barrier's waits keep their numbers whatever
// ends them, and so do the waits of the dissemination rounds that a
// failed round leaves (skipWaits): no count this rank waits for falls
// behind its sender's. The linear barrier has put every signal before it
// waits, so every (sender, receiver, channel) count advances by one per
// barrier, met or failed, on both sides, and the k-th barriers keep
// meeting: the failed barrier returns its error, the late peer's returns
// success, truthfully (every rank entered it; what the rank that gave up
// wrote after its error is its own affair). A dissemination round's signal
// says that every rank its sender has heard from entered the barrier, so
// the signals of the rounds after a failed one are not put: the peers
// that wait for them time out rather than pass a barrier that a rank has
// not entered, and since those counts stay one short, so does every later
// barrier on the channel at those peers: the channel fails loudly there
// (use another channel or group), never with a barrier passed early.
// Barriers on a stream number their waits when they are enqueued, so a
// stream wait that gives up has its number kept as well.

// skipWaits takes the numbers of a barrier's waits for srcs without
// waiting (Note [Barriers that fail]).
func (h *Handle) skipWaits(channel int, srcs []int) {
	for _, src := range srcs {
		atomic.AddUint32(&h.sig.seen[h.sig.index(src, channel)], 1)
	}
}

// hostStep puts to every rank of dsts, then waits for every rank of srcs;
// a wait that ends otherwise than reached or timed out ends the step, the
// numbers of the waits left taken (Note [Barriers that fail]).
func (h *Handle) hostStep(channel int, dsts, srcs []int, deadline time.Time, timeout time.Duration) error {
	for _, dst := range dsts {
		h.putHost(dst, channel)
	}
	var late []int
	for i, src := range srcs {
		var err error
		switch h.waitHost(src, channel, deadline, true) {
		case waitReleased:
			err = h.releasedDuring(fmt.Sprintf("a barrier on channel %d", channel))
		case waitAborted:
			err = h.gm.abortedErr(fmt.Sprintf("a barrier on channel %d", channel))
		case waitInterrupted:
			err = h.interruptedWait(fmt.Sprintf("barrier on channel %d", channel))
		case waitPeerExited:
			err = h.gm.live.Exited(src, fmt.Sprintf("rank %d's barrier on channel %d", h.rank, channel))
		case waitTimedOut:
			late = append(late, src)
		}
		if err != nil {
			h.skipWaits(channel, srcs[i+1:])
			return err
		}
	}
	if len(late) > 0 {
		return core.Errorf(core.ErrTimeout, "group %q: rank %d timed out after %v in a barrier on channel %d: no signal from rank(s) %s",
			h.name, h.rank, timeout, channel, core.RanksText(late))
	}
	return nil
}

// interruptedWait is the error of a handle's host wait that a signal ended;
// the group is aborted.
func (h *Handle) interruptedWait(what string) error {
	h.gm.abortFor(fmt.Sprintf("a signal interrupted rank %d's %s", h.rank, what))
	return core.InterruptedErr(h.name, h.rank, what)
}

// barrierWord is word 2 of this rank's device region: the buffer of the
// all-reduce that serves as a barrier across machines (its value means
// nothing).
func (h *Handle) barrierWord() uintptr { return h.padPtrs[h.rank] + h.padSize + 8 }

// spanBarrier is Barrier on a group that spans machines.
func (h *Handle) spanBarrier(channel int, s core.Stream, timeout time.Duration) error {
	sp := h.span
	if sp.comm == nil {
		return sp.across.NoEngine(barrierText(channel))
	}
	if sp.osig != nil && sp.hasSlot(channel) {
		return h.signalBarrier(channel, s, timeout)
	}
	red, ok := sp.comm.(reducer)
	if !ok {
		return core.Errorf(core.ErrUnavailable, "group %q: %s across machines needs NCCL's one-sided signals or its typed collectives; %s has neither", h.name, barrierText(channel), sp.comm.Describe())
	}
	w := h.barrierWord()
	if err := red.AllReduce(s, w, w, 1, core.Int32, core.OpSum); err != nil {
		return sp.across.EngineErr(barrierText(channel), err)
	}
	return nil
}

// barrierText names a barrier on channel for messages.
func barrierText(channel int) string { return fmt.Sprintf("a barrier on channel %d", channel) }

// signalBarrier: a signal to every peer, then a wait for every peer; local
// peers through the pads, remote ones through the one-sided signals.
func (h *Handle) signalBarrier(channel int, s core.Stream, timeout time.Duration) error {
	sp := h.span
	osig, local, remote := sp.osig, sp.localPeers, sp.remotePeers
	for _, p := range remote {
		if err := osig.Signal(s, p, channel); err != nil {
			return sp.across.EngineErr(barrierText(channel), err)
		}
	}
	if h.onStreams() {
		if err := h.streamSignals(s, timeout, channel, local, local); err != nil {
			return err
		}
	} else if err := h.hostStep(channel, local, local, time.Now().Add(timeout), timeout); err != nil {
		return err
	}
	for _, p := range remote {
		if err := osig.WaitSignal(s, p, channel, 1); err != nil {
			return sp.across.EngineErr(barrierText(channel)+" waiting for "+sp.where(p), err)
		}
	}
	return nil
}
