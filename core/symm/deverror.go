package symm

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// DeviceErrorText says what a device error flag records: nil for 0 and
// for a timeout (the flag itself names the peer and set), ErrMismatch for a
// peer's different collective arguments, ErrPeer for a peer's exit,
// ErrInvalidArgument for an all-to-all's refusal (Note [All-to-all] in
// core/symm/coll), ErrInvalidState for a wait that gave up because a
// peer's collective had (the stop word's value, Note [Failed collectives]
// in core/symm/coll).
//
// A kernel that found the group stopped because a peer found other
// collective arguments (before this rank's kernel compared them: which
// rank sees the difference first is a race on the GPU) is ErrMismatch
// too, so that every rank of a mismatched call reports the same code.
func (h *Handle) DeviceErrorText(v uint32) error {
	if v&core.DevFlagFailed != 0 && v>>29&3 == core.DevCauseGaveUp && !core.IsDevOverrun(v) {
		err := h.stoppedErr(v)
		if v>>12&3 == core.DevCauseMismatch {
			return core.Errorf(core.ErrMismatch, "%s", err.Error())
		}
		return err
	}
	if v&core.DevFlagFailed == 0 {
		return nil
	}
	peer, set := int(v>>16&0x1fff), int(v&0xffff)
	switch v >> 29 & 3 {
	case core.DevCauseMismatch:
		// On a group that spans machines the collectives that run here
		// run on the team view, whose flag names a view rank (Note [Team
		// view] in core/symm/coll).
		if h.span != nil && peer < len(h.span.team) {
			peer = h.span.team[peer]
		}
		return core.Errorf(core.ErrMismatch, "group %q: rank %d: the device error flag %#x says that rank %d called a collective with other arguments than this rank (kernel block %d of collective channel %d; no data moved); the group's device barriers are no longer balanced: use another group",
			h.name, h.rank, v, peer, set%core.CollMaxBlocks, set/core.CollMaxBlocks)
	case core.DevCauseGaveUp: // the all-to-all's refusal: IsDevOverrun
		set &^= core.DevOverrunSetBit
		if peer == h.rank {
			return core.Errorf(core.ErrInvalidArgument, "group %q: rank %d: the device error flag %#x says that an all-to-all's rows for this rank, as laid out, passed its out_rows (nothing was written to out; out_splits_offsets holds what was sent; device set %d)",
				h.name, h.rank, v, set)
		}
		return core.Errorf(core.ErrInvalidArgument, "group %q: rank %d: the device error flag %#x says that rank %d's all-to-all splits were bad: a negative split or offset, or rows past its input (nothing was written to out; device set %d)",
			h.name, h.rank, v, peer, set)
	case core.DevCausePeerExited:
		if peer == h.gm.rank && h.gm.abort.aborted() { // Note [Abort]: our own abort word
			return core.Errorf(core.ErrAborted, "group %q: rank %d: the device error flag %#x says that a kernel gave up on device set %d because the group was aborted (%s)",
				h.name, h.rank, v, set, h.gm.abort.why)
		}
		return core.Errorf(core.ErrPeer, "group %q: rank %d: the device error flag %#x says that rank %d's process exited while a kernel waited for it (device set %d)",
			h.name, h.rank, v, peer, set)
	}
	return nil
}

// DeviceError is word 0 of this rank's device region: 0, or what the first
// kernel wait that gave up recorded (Note [Pad partition] in core).
func (h *Handle) DeviceError() (uint32, error) {
	if !h.life.enter() { // also on an aborted group (Note [Abort])
		return 0, h.releasedErr()
	}
	defer h.life.leave()
	addr := h.padPtrs[h.rank] + h.padSize
	if !h.gm.be.Capabilities().StreamSignals {
		return atomic.LoadUint32((*uint32)(unmanaged.Pointer(addr))), nil
	}
	// On the library's own stream, bounded by the group's timeout: the
	// flag is read when something went wrong, which is when the caller's
	// streams (the legacy default stream too) may be stuck on a wait.
	// The backend writes through v's address as a uintptr: pinned, v is on
	// the heap and stays put (on the goroutine's stack it could move
	// before the copy, which would then write the old stack).
	v := make([]uint32, 1)
	pin := new(runtime.Pinner)
	pin.Pin(&v[0])
	err := h.gm.copyOut(uintptr(unsafe.Pointer(&v[0])), addr, 4)
	unpinUnlessLate(pin, err)
	if err != nil {
		return 0, core.Errorf(core.CodeOf(err), "group %q: rank %d: reading the device error flag: %v", h.name, h.rank, err)
	}
	return v[0], nil
}

// CollectivesStopped is the error of a collective on a group whose
// collectives stopped after a failure (Note [Failed collectives] in
// core/symm/coll), or nil. One load of host memory: the stop word itself
// where the pads are the CPU's memory, its pinned mirror where kernels run
// (which the kernel that gave up, or the next one, wrote); no device
// synchronisation.
func (h *Handle) CollectivesStopped() error {
	if h.stopRead == 0 {
		return nil
	}
	if v := atomic.LoadUint32((*uint32)(unmanaged.Pointer(h.stopRead))); v != 0 {
		return h.stoppedErr(v)
	}
	return nil
}

// setText names device set s of the library's sets as a collective's wait.
func setText(s int) string {
	return fmt.Sprintf("collective channel %d, kernel block %d (device set %d)", s/core.CollMaxBlocks, s%core.CollMaxBlocks, s)
}

// stoppedErr is the error of a collective on a group whose stop word holds
// v (Note [Pad partition] in core): it names the first failure and says
// how to go on.
func (h *Handle) stoppedErr(v uint32) error {
	peer, set := int(v>>16&0x1fff), int(v&0xffff)
	// On a group that spans machines the stop word names a rank of the
	// local team but for cause 2 (Note [Team view] in core/symm/coll).
	global := func(r int) int {
		if h.span != nil && r < len(h.span.team) {
			return h.span.team[r]
		}
		return r
	}
	var first string
	switch v >> 29 & 3 {
	case core.DevCauseTimeout:
		first = fmt.Sprintf("this rank's collective timed out waiting for rank %d (%s)", global(peer), setText(set))
	case core.DevCauseMismatch:
		first = fmt.Sprintf("rank %d called a collective with other arguments than this rank (%s); a kernel that finds that returns without its closing barrier", global(peer), setText(set))
	case core.DevCausePeerExited: // names a group rank (Note [Team view])
		if peer == h.rank {
			first = fmt.Sprintf("this rank's collective gave up: a wait was cut short (the group was aborted, the handle released or a signal came) or its step across machines failed (%s)", setText(set))
		} else {
			first = fmt.Sprintf("rank %d's process exited while this rank's collective waited for it (%s)", peer, setText(set))
		}
	default: // core.DevCauseGaveUp
		why := [...]string{"its wait timed out", "it found other collective arguments", "its wait was cut short, a peer exited or its step across machines failed", "it found its peers stopped"}[set>>12&3]
		first = fmt.Sprintf("rank %d gave up a collective (%s): %s", global(peer), setText(set&0xfff), why)
	}
	return core.Errorf(core.ErrInvalidState, "group %q: rank %d: the group's collectives are stopped since %s (stop word %#x): the ranks' barriers and argument slots are no longer in step, so no later collective on this group can run correctly; abort the group (symmem_group_abort), destroy it and create a new one",
		h.name, h.rank, first, v)
}
