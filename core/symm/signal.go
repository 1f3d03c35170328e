package symm

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/libsymmem/libsymmem/core"
)

// Note [Signals]
//
// Slot channel*world + sender of the receiver's pad is a 32-bit word that
// is 0 (clear) or 1 (set). Only the sender sets it (0 -> 1) and only the
// receiver clears it (1 -> 0), so one signal is in flight per (sender,
// receiver, channel) and none is lost: a put waits for the previous one to
// be consumed. On the host backend both moves are compare-and-swap loops on
// the calling thread (sequentially consistent, so stores made before a put
// are visible after the matching wait), bounded by the timeout. On the cuda
// backend they are stream operations (wait for the word, then write it),
// enqueued on the caller's stream and ordered with its other work there; the
// GPU does not enforce a timeout.

// slot is the address of the word for (receiver, sender, channel).
func (h *Handle) slot(receiver, sender, channel int) uintptr {
	return h.padPtrs[receiver] + uintptr(4*(channel*h.world+sender))
}

func (h *Handle) timeoutOr(t time.Duration) time.Duration {
	if t <= 0 {
		return h.timeout
	}
	return t
}

func (h *Handle) onStreams() bool { return h.gm.be.Name() == "cuda" }

// move changes the word at addr from old to new: at once on a stream, or
// on this thread by compare-and-swap, waiting until deadline for the word to
// hold old.
func (h *Handle) move(addr uintptr, old, new uint32, s core.Stream, deadline time.Time, timeout time.Duration) (timedOut bool, err error) {
	if h.onStreams() {
		return false, h.gm.be.StreamMemOps(h.gm.device, s, moveOps(nil, addr, old, new), timeout)
	}
	word := (*uint32)(ptrAt(addr))
	sleep := time.Microsecond
	for i := 0; ; i++ {
		if atomic.CompareAndSwapUint32(word, old, new) {
			return false, nil
		}
		switch {
		case i < 100:
		case i < 300:
			runtime.Gosched()
		default:
			if !time.Now().Before(deadline) {
				return true, nil
			}
			time.Sleep(sleep)
			if sleep < 100*time.Microsecond {
				sleep *= 2
			}
		}
	}
}

func (h *Handle) checkSignal(peerWhat string, peer, channel int) error {
	if err := h.live(); err != nil {
		return err
	}
	if err := h.checkRank(peerWhat, peer); err != nil {
		return err
	}
	return h.checkChannel(channel)
}

// PutSignal sets our slot in dst's pad on channel, after waiting for dst to
// have consumed the previous signal there. timeout <= 0 means the group's.
func (h *Handle) PutSignal(dst, channel int, s core.Stream, timeout time.Duration) error {
	if err := h.checkSignal("destination rank", dst, channel); err != nil {
		return err
	}
	timeout = h.timeoutOr(timeout)
	return h.put(dst, channel, s, time.Now().Add(timeout), timeout)
}

func (h *Handle) put(dst, channel int, s core.Stream, deadline time.Time, timeout time.Duration) error {
	to, err := h.move(h.slot(dst, h.rank, channel), 0, 1, s, deadline, timeout)
	if to {
		return core.Errorf(core.ErrTimeout, "group %q: rank %d timed out after %v putting a signal to rank %d on channel %d: rank %d has not consumed the previous one (is it waiting on this channel?)",
			h.name, h.rank, timeout, dst, channel, dst)
	}
	return err
}

// WaitSignal waits until src's slot in our pad is set on channel, then
// clears it. timeout <= 0 means the group's.
func (h *Handle) WaitSignal(src, channel int, s core.Stream, timeout time.Duration) error {
	if err := h.checkSignal("source rank", src, channel); err != nil {
		return err
	}
	timeout = h.timeoutOr(timeout)
	return h.wait(src, channel, s, time.Now().Add(timeout), timeout)
}

func (h *Handle) wait(src, channel int, s core.Stream, deadline time.Time, timeout time.Duration) error {
	to, err := h.move(h.slot(h.rank, src, channel), 1, 0, s, deadline, timeout)
	if to {
		return core.Errorf(core.ErrTimeout, "group %q: rank %d timed out after %v waiting for rank %d's signal on channel %d",
			h.name, h.rank, timeout, src, channel)
	}
	return err
}

// Barrier puts a signal to every peer on channel, then waits for one from
// every peer. timeout <= 0 means the group's; it bounds the whole barrier.
func (h *Handle) Barrier(channel int, s core.Stream, timeout time.Duration) error {
	if err := h.checkSignal("rank", h.rank, channel); err != nil {
		return err
	}
	timeout = h.timeoutOr(timeout)
	if h.onStreams() {
		// The whole barrier as one batch on the stream: every put, then
		// every wait, in the order of the host path below.
		ops := make([]core.MemOp, 0, 4*(h.world-1))
		for i := 1; i < h.world; i++ {
			ops = moveOps(ops, h.slot((h.rank+i)%h.world, h.rank, channel), 0, 1)
		}
		for i := 1; i < h.world; i++ {
			ops = moveOps(ops, h.slot(h.rank, (h.rank+h.world-i)%h.world, channel), 1, 0)
		}
		return h.gm.be.StreamMemOps(h.gm.device, s, ops, timeout)
	}
	deadline := time.Now().Add(timeout)
	// Start with the next rank so that ranks do not all hit rank 0 first.
	for i := 1; i < h.world; i++ {
		if err := h.put((h.rank+i)%h.world, channel, s, deadline, timeout); err != nil {
			return err
		}
	}
	var late []int
	for i := 1; i < h.world; i++ {
		src := (h.rank + h.world - i) % h.world
		if err := h.wait(src, channel, s, deadline, timeout); err != nil {
			if core.CodeOf(err) != core.ErrTimeout {
				return err
			}
			late = append(late, src)
		}
	}
	if len(late) > 0 {
		return core.Errorf(core.ErrTimeout, "group %q: rank %d timed out after %v in a barrier on channel %d: no signal from rank(s) %s",
			h.name, h.rank, timeout, channel, ranksText(late))
	}
	return nil
}

// moveOps appends to ops the stream operations that move a slot from old to
// new: wait until it holds old, then store new. On a stream the two are not
// one atomic step, and need not be: each slot has one writer of each value
// (only the sender sets it, only the receiver clears it).
func moveOps(ops []core.MemOp, addr uintptr, old, new uint32) []core.MemOp {
	return append(ops, core.MemOp{Addr: addr, Value: old, Wait: true}, core.MemOp{Addr: addr, Value: new})
}
