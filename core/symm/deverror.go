package symm

import (
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// DeviceErrorText says what a device error flag records: nil for 0 and
// for a timeout (the flag itself names the peer and set), ErrMismatch for a
// peer's different collective arguments, ErrPeer for a peer's exit,
// ErrInvalidArgument for an all-to-all's overrun (Note [All-to-all] in
// core/symm/coll).
func (h *Handle) DeviceErrorText(v uint32) error {
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
	case core.DevCauseOverrun:
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
