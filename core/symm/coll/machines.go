package coll

import "github.com/libsymmem/libsymmem/core"

// acrossMachines runs the collectives of a handle whose group spans
// machines (Note [Collectives across machines] in core/symm): whole on the
// group's engine, or the hierarchical all-reduce (Note [Hierarchical
// all-reduce]) over the team view and the engine split by local rank.
type acrossMachines struct{ View }

// run runs a checked collective c on the group's engine, or
// hierarchically.
func (h acrossMachines) run(a Args, c *core.Collective) error {
	engine := h.Engine()
	if engine == nil {
		return h.NoEngine(c.Kind.String())
	}
	red, ok := engine.(core.Reducer)
	if !ok {
		return core.Errorf(core.ErrUnavailable, "group %q: %s across machines needs typed collectives from %s, which it lacks", h.GroupName(), c.Kind, engine.Describe())
	}
	hier, err := h.hierPlan(a, c)
	if err != nil {
		return err
	}
	if hier {
		return h.hierAllReduce(a, c)
	}
	in := h.Buffers()[h.Rank()] + c.InOffset
	switch c.Kind {
	case core.AllReduce:
		err = red.AllReduce(a.Stream, in, c.Out, c.Count, c.DType, c.Op)
	case core.AllGather:
		err = red.AllGatherTyped(a.Stream, in, c.Out, c.Count, c.DType)
	case core.ReduceScatter:
		err = red.ReduceScatter(a.Stream, in, c.Out, c.Count/uintptr(h.World()), c.DType, c.Op)
	}
	if err != nil {
		return h.EngineErr(c.Kind.String(), err)
	}
	return nil
}
