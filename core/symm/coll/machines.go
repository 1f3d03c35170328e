package coll

import (
	"sync/atomic"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// The collectives of a handle whose group spans machines (Note
// [Collectives across machines] in core/symm) run whole on the group's
// engine, or as the hierarchical all-reduce (Note [Hierarchical
// all-reduce]) over the team view and the engine split by local rank.

// runAcross runs a checked collective c on the group's engine, or
// hierarchically.
func (h *target) runAcross(a Args, c *core.Collective) error {
	engine := h.engine()
	if engine == nil {
		return h.Span.NoEngine(c.Kind.String())
	}
	red, ok := engine.(core.Reducer)
	if !ok {
		return core.Errorf(core.ErrUnavailable, "group %q: %s across machines needs typed collectives from %s, which it lacks", h.GroupName, c.Kind, engine.Describe())
	}
	hier, err := h.hierPlan(a, c)
	if err != nil {
		return err
	}
	if hier {
		return h.hierAllReduce(a, c)
	}
	in := h.Buffers[h.Rank] + c.InOffset
	switch c.Kind {
	case core.AllReduce:
		err = red.AllReduce(a.Stream, in, c.Out, c.Count, c.DType, c.Op)
	case core.AllGather:
		err = red.AllGatherTyped(a.Stream, in, c.Out, c.Count, c.DType)
	case core.ReduceScatter:
		err = red.ReduceScatter(a.Stream, in, c.Out, c.Count/uintptr(h.World), c.DType, c.Op)
	}
	if err != nil {
		h.stopAfterEngine(c)
		return h.Span.EngineErr(c.Kind.String(), err)
	}
	return nil
}

// stopAfterEngine stops the group's collectives after a step of c on the
// engine failed (Note [Failed collectives]): an engine matches the ranks'
// calls by their order, so this rank's next call could meet a late peer's
// failed one. On CPU memory it writes the stop words of this rank and its
// team, as a wait that gave up would; where kernels run, the stop word's
// pinned mirror (the host does not write the device's words; the team's
// kernels find out in their own waits, and give up then).
func (h *target) stopAfterEngine(c *core.Collective) {
	set := c.Channel * core.CollMaxBlocks
	flag := core.DevFlag(core.DevCausePeerExited, h.Rank, set) // cause 2 names a group rank
	if m := h.StopMirror; m != 0 {
		atomic.CompareAndSwapUint32((*uint32)(unmanaged.Pointer(m)), 0, flag)
		return
	}
	if h.Backend.Capabilities().StreamSignals {
		return
	}
	if l, ok := teamView(h); ok {
		l.stop(flag)
		return
	}
	own := h.SignalPads[h.Rank] + h.SignalPadSize + 4*core.DevStopWord
	atomic.CompareAndSwapUint32((*uint32)(unmanaged.Pointer(own)), 0, flag)
}
