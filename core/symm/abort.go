package symm

import (
	"runtime"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
)

// Note [Abort]
//
// A rank whose peer is gone (or hung, or whose job is being torn down) must
// be able to get every wait of its group back without waiting out the
// timeout. Group.Abort, callable from any thread at any time:
//
//  1. marks the group aborted: every later call on the group or its
//     handles fails with ErrAborted (getters and the device error flag
//     still answer; Release and Destroy work as before);
//  2. cancels the group's channel and control page (ipc.Channel.Cancel):
//     a group collective in flight (rendezvous, pause, resume) fails at
//     once, and reports ErrAborted;
//  3. ends the host backend's waits (barriers, signal waits, collectives):
//     they watch the abort channel next to the handle's closing mark;
//  4. on backends whose waits run on streams, releases them: the stream
//     waits compare the counts in this rank's own pad with what they expect
//     (Note [Signals]), so writing every count of our pad 2^30 past what
//     this rank has waited for satisfies every wait enqueued so far; and it
//     writes the abort word of our device region (Note [Pad partition] in core),
//     which every waiting kernel reads and gives up on. Both writes go
//     through the library's own stream, bounded by the group's timeout, so
//     that a stuck stream of the caller's does not hold them up.
//
// Nothing here takes the group's collective lock or the locks of its
// memory, which a stuck call may hold (a device synchronisation under one
// of them waits for exactly the stream waits that the abort releases):
// the pad to write is published in abortState.region under a lock of its
// own, which only the pad's release takes besides.
//
// The abort is this rank's: peers learn of it as of any rank that stops
// (their waits for it fail with TIMEOUT, or PEER once its process exits),
// unless they abort too. A peer writing its counts into our pad after the
// abort may lower a slot again; a stream wait enqueued before the abort
// that the GPU had not yet re-read may then stay blocked (kernels still
// see the abort word). A wait that a signal interrupts (Note [Interrupts]
// in core) aborts its group the same way.

// abortedErr is the error of a call on an aborted group.
func (gm *groupMem) abortedErr(what string) error {
	return core.Errorf(core.ErrAborted, "group %q: rank %d: %s: the group was aborted (%s): destroy it", gm.name, gm.rank, what, gm.abort.why)
}

// devAbortWord is the abort word Abort writes: the peer field names this
// rank (kernels record it in the error flag as a peer's exit).
func devAbortWord(rank int) uint32 { return core.DevFlagFailed | 3<<29 | uint32(rank&0x1fff)<<16 }

// abortFor marks the group's memory aborted and releases the stream waits;
// for handle waits, which cannot reach the group (its channel is idle
// then: group collectives and handle waits do not overlap on one thread).
func (gm *groupMem) abortFor(why string) {
	if gm.abort.mark(why) {
		gm.releaseDeviceWaits()
	}
}

// releaseDeviceWaits writes this rank's counts forward and its abort word
// (step 4 of Note [Abort]); nothing on backends whose waits run on threads.
func (gm *groupMem) releaseDeviceWaits() error {
	if !gm.be.Capabilities().StreamSignals {
		return nil
	}
	a := gm.abort
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.region
	if p == nil {
		return nil
	}
	c := p.sig
	words := make([]uint32, c.channels*gm.world+1)
	c.mu.Lock()
	for ch := 0; ch < c.channels; ch++ {
		for s := 0; s < gm.world; s++ {
			words[ch*gm.world+s] = c.seen[c.index(s, ch)] + 1<<30
		}
	}
	c.mu.Unlock()
	n := len(words) - 1
	words[n] = devAbortWord(gm.rank)
	// The words are stored by the device where the backend can
	// (core.WordWriter): a copy from host memory goes through the driver's
	// staging, which a synchronous copy of another thread, stuck behind the
	// very stream wait the abort must release, holds (on 2 H200 such waits
	// ended at their timeout, not at the abort).
	if _, ok := gm.be.(core.WordWriter); ok {
		ops := make([]core.MemOp, 0, len(words))
		ops = append(ops, core.MemOp{Addr: p.addr[gm.rank] + p.size + 4, Value: words[n]})
		for i := 0; i < n; i++ {
			ops = append(ops, core.MemOp{Addr: p.addr[gm.rank] + uintptr(4*i), Value: words[i]})
		}
		if err := gm.writeWords(ops); err != nil {
			return core.Errorf(core.CodeOf(err), "group %q: rank %d: the group is aborted, but writing its counts forward to release its stream waits failed: %v", gm.name, gm.rank, err)
		}
		return nil
	}
	var err error
	pin := new(runtime.Pinner)
	pin.Pin(&words[0])
	base := uintptr(unsafe.Pointer(&words[0]))
	err = gm.copyOut(p.addr[gm.rank]+p.size+4, base+uintptr(4*n), 4)
	if cerr := gm.copyOut(p.addr[gm.rank], base, uintptr(4*n)); err == nil || core.CodeOf(cerr) == core.ErrTimeout {
		err = cerr
	}
	unpinUnlessLate(pin, err)
	if err != nil {
		return core.Errorf(core.CodeOf(err), "group %q: rank %d: the group is aborted, but writing its counts forward to release its stream waits failed: %v", gm.name, gm.rank, err)
	}
	return nil
}
