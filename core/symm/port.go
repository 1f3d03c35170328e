package symm

import (
	"time"

	"github.com/libsymmem/libsymmem/core"
)

// A handle meets the collectives (core/symm/coll) in two parts: its
// description (core.SymmetricBuffer), made once when the rendezvous
// completes, and the methods of coll.Port below, for what changes while
// the handle lives (its release, the group's abort and stop word, the
// group's staging memory). This package knows nothing of collectives; the
// collectives know the handle only through these.

// Symmetric is the handle's description, as the collectives take it.
func (h *Handle) Symmetric() core.SymmetricBuffer { return h.sym }

// Enter admits a collective on the handle; leave ends it. It refuses one
// on a group whose collectives stopped (Note [Failed collectives] in
// core/symm/coll): the one check every collective makes before it runs.
func (h *Handle) Enter() (leave func(), err error) {
	if err := h.enter(); err != nil {
		return nil, err
	}
	if err := h.CollectivesStopped(); err != nil {
		h.life.leave()
		return nil, err
	}
	return h.life.leave, nil
}

// WaitCut ends a host-side wait that the handle's release, the group's
// abort or a signal cut short (Note [Calls in flight], Note [Abort], Note
// [Interrupts] in core).
func (h *Handle) WaitCut(mark uint64, what string) error {
	if h.life.closed() {
		return h.releasedDuring("a " + what)
	}
	select {
	case <-h.gm.abort.ch:
		return h.gm.abortedErr("a " + what)
	default:
	}
	if core.InterruptedSince(mark) {
		return h.interruptedWait(what)
	}
	return nil
}

// PeerExited is the error of a wait on group rank r whose process exited
// (Note [Dead peers] in core/ipc), or nil.
func (h *Handle) PeerExited(r int, now time.Time, checked *time.Time, what string) error {
	if !h.peerExited(r, now, checked) {
		return nil
	}
	return h.gm.live.Exited(r, what)
}

// Staging lends the group's staging buffers (n bytes or more of device
// memory and of host memory) to one call; done ends the loan (with an
// error: the GPU may still write them, so they are never used again).
// Only a group over a communicator has them.
func (h *Handle) Staging(n uintptr) (dev, host uintptr, done func(broken error), err error) {
	if h.span == nil || h.span.stage == nil {
		return 0, 0, nil, core.Errorf(core.ErrUnavailable, "group %q has no staging memory: it lives on no communicator", h.name)
	}
	return h.span.stage.stage(n)
}
