package symm

import (
	"fmt"
	"sync"
	"time"

	"github.com/libsymmem/libsymmem/core"
)

// View is a handle as the collectives (core/symm/coll, its View interface)
// see it: every rank's block and pad, the bounds of the handle's waits, the
// backend, and on a group that spans machines the team and the engine.
// This package knows nothing of collectives; the collectives know the
// handle only through these methods.
type View struct{ h *Handle }

// View is the handle as the collectives see it.
func (h *Handle) View() View { return View{h} }

// Enter admits a collective on the handle; leave ends it. It refuses one
// on a group whose collectives stopped (Note [Failed collectives] in
// core/symm/coll): the one check every collective makes before it runs.
func (v View) Enter() (leave func(), err error) {
	if err := v.h.enter(); err != nil {
		return nil, err
	}
	if err := v.Stopped(); err != nil {
		v.h.life.leave()
		return nil, err
	}
	return v.h.life.leave, nil
}

// Stopped is the error of a collective on a group whose collectives
// stopped, or nil.
func (v View) Stopped() error { return v.h.CollectivesStopped() }

// StopMirror is the pinned host word that kernels copy the stop word into.
func (v View) StopMirror() uintptr { return v.h.stopMirror }

func (v View) GroupName() string      { return v.h.name }
func (v View) Rank() int              { return v.h.rank }
func (v View) World() int             { return v.h.world }
func (v View) Timeout() time.Duration { return v.h.timeout }
func (v View) BufferSize() uintptr    { return v.h.bufSize }
func (v View) Offset() uintptr        { return v.h.offset }
func (v View) SignalPadSize() uintptr { return v.h.padSize }

// Buffers and SignalPads are the handle's own slices (read only).
func (v View) Buffers() []uintptr    { return v.h.bufPtrs }
func (v View) SignalPads() []uintptr { return v.h.padPtrs }

// PointerArrays are the device copies of the pointer arrays (the host ones
// on the host backend).
func (v View) PointerArrays() (bufs, pads uintptr) {
	_, bufs = v.h.BufferPtrs()
	_, pads = v.h.SignalPadPtrs()
	return bufs, pads
}

func (v View) Backend() (core.Backend, int) { return v.h.gm.be, v.h.gm.device }

// ChannelLock is the lock of collective channel channel of the group's
// pads.
func (v View) ChannelLock(channel int) *sync.Mutex { return v.h.gm.pads.channelLock(channel) }

// WaitCut ends a host-side wait that the handle's release, the group's
// abort or a signal cut short (Note [Calls in flight], Note [Abort], Note
// [Interrupts] in core).
func (v View) WaitCut(mark uint64, what string) error {
	h := v.h
	if h.life.closed() {
		return signalPath{h}.releasedDuring("a " + what)
	}
	select {
	case <-h.gm.abort.ch:
		return h.gm.abortedErr("a " + what)
	default:
	}
	if core.InterruptedSince(mark) {
		return signalPath{h}.interruptedWait(what)
	}
	return nil
}

// PeerExited is the error of a wait on group rank r whose process exited
// (Note [Dead peers] in core/ipc), or nil.
func (v View) PeerExited(r int, now time.Time, checked *time.Time, what string) error {
	if !(signalPath{v.h}).peerExited(r, now, checked) {
		return nil
	}
	return v.h.gm.live.Exited(r, what)
}

// Team is this rank's team and the team view's device pointer arrays (Note
// [Team view] in core/symm/coll); nil on a group of one machine.
func (v View) Team() (ranks []int, bufs, pads uintptr) {
	h := v.h
	if h.span == nil {
		return nil, 0, 0
	}
	if h.teamDevArr == 0 {
		return h.span.team, 0, 0
	}
	return h.span.team, h.teamDevArr, h.teamDevArr + uintptr(8*len(h.span.team))
}

// TeamSizes says whether the teams have one size, and names their sizes.
func (v View) TeamSizes() (uniform bool, sizes string) {
	if v.h.span == nil {
		return true, fmt.Sprint(v.h.world)
	}
	return v.h.span.uniform, v.h.span.teamSizes()
}

// Engine is the group's communicator (nil: none).
func (v View) Engine() core.Communicator {
	if v.h.span == nil {
		return nil
	}
	return v.h.span.comm
}

// SplitByLocalRank is the group's communicator split by local rank (Note
// [Hierarchical all-reduce] in core/symm/coll), made on first use.
func (v View) SplitByLocalRank() (core.Communicator, func(), error) {
	s := v.h.span
	if s == nil {
		return nil, nil, core.Errorf(core.ErrInvalidState, "the group does not span machines: it has no communicator to split by local rank")
	}
	parent, ok := s.comm.(splitter)
	if !ok {
		return nil, nil, core.Errorf(core.ErrUnavailable, "splitting by local rank needs a communicator that splits (ncclCommSplit); the group has %s", v.engineName())
	}
	return s.hier.use(parent, s.localRank, v.h.rank)
}

func (v View) engineName() string {
	if c := v.Engine(); c != nil {
		return c.Describe()
	}
	return "none"
}

// SplitClosed says whether the group's destruction closed its split
// communicator.
func (v View) SplitClosed() bool { return v.h.span != nil && v.h.span.hier.isClosed() }

// EngineErr and NoEngine are the errors of the group's engine (Note
// [Collectives across machines]).
func (v View) EngineErr(what string, err error) error {
	return acrossMachines{v.h}.engineErr(what, err)
}
func (v View) NoEngine(what string) error { return acrossMachines{v.h}.noEngine(what) }

// Staging lends the group's staging buffers (n bytes or more of device
// memory and of host memory) to one call; done ends the loan (with an
// error: the GPU may still write them, so they are never used again).
// Only a group over a communicator has them.
func (v View) Staging(n uintptr) (dev, host uintptr, done func(broken error), err error) {
	if v.h.span == nil || v.h.span.stage == nil {
		return 0, 0, nil, core.Errorf(core.ErrUnavailable, "group %q has no staging memory: it lives on no communicator", v.h.name)
	}
	return v.h.span.stage.stage(n)
}
