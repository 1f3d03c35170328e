package coll

import (
	"fmt"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// local is the ranks of one machine that a checked collective runs over
// with the library's own machinery: kernels enqueued on a stream where the
// backend launches them, else the host reference runner (runHost) on this
// thread over CPU memory, which reads and writes the pads' device regions
// (Note [Pad partition] in core) as the kernels do. It is a handle's whole
// group (wholeGroup) or, on a group that spans machines, its team view
// (teamView, Note [Team view]).
type local struct {
	h           *target
	rank, world int
	// bufs and pads are every rank's block and pad by rank of the view;
	// bufArr and padArr the arrays of them that kernels read.
	bufs, pads     []uintptr
	bufArr, padArr uintptr
	// ranks, on a team view, is the group rank of each view rank; nil on
	// the whole group.
	ranks []int
}

// wholeGroup is the local run over every rank of h's group.
func wholeGroup(h *target) local {
	return local{h: h, rank: h.Rank, world: h.World, bufs: h.Buffers, pads: h.SignalPads, bufArr: h.BufferArray, padArr: h.PadArray}
}

// teamView is the local run over h's team (Note [Team view]); ok is false
// while the handle has no team arrays.
func teamView(h *target) (l local, ok bool) {
	team, bufArr, padArr := h.team(), h.TeamBufferArray, h.TeamPadArray
	if team == nil || bufArr == 0 {
		return local{}, false
	}
	l = local{h: h, world: len(team), bufs: make([]uintptr, len(team)), pads: make([]uintptr, len(team)),
		bufArr: bufArr, padArr: padArr, ranks: team}
	bufs, pads := h.Buffers, h.SignalPads
	for i, r := range team {
		l.bufs[i], l.pads[i] = bufs[r], pads[r]
		if r == h.Rank {
			l.rank = i
		}
	}
	return l, true
}

// global is the group rank of view rank r (r itself on the whole group).
func (l local) global(r int) int {
	if l.ranks != nil && r >= 0 && r < len(l.ranks) {
		return l.ranks[r]
	}
	return r
}

// text says which ranks a view's message numbers ("" on the whole group).
func (l local) text() string {
	if l.ranks == nil {
		return ""
	}
	return fmt.Sprintf(" of the local team (ranks %s, numbered 0..%d in that order below)", core.RanksText(l.ranks), len(l.ranks)-1)
}

// collective is c over the view with the view's pointer arrays, for a
// phase of the hierarchical form: out at outAt of every rank's block.
func (l local) collective(c *core.Collective, kind core.CollKind, count, inOff, outAt uintptr, sliced bool) *core.Collective {
	p := &core.Collective{Kind: kind, DType: c.DType, Op: c.Op, Algo: core.AlgoOneShot, Count: count, Rank: l.rank, World: l.world,
		Buffers: l.bufArr, Pads: l.padArr, PadSize: l.h.SignalPadSize, InOffset: inOff, Out: l.bufs[l.rank] + outAt, OutOffset: int64(outAt),
		SlicedInput: sliced, Channel: c.Channel, TimeoutNs: c.TimeoutNs}
	p.Digest = argsDigest(argsWord(p))
	return p
}

// run runs checked collective c of the view with the library's own
// machinery: kernels on stream s, or on this thread over CPU memory.
func (l local) run(c *core.Collective, s core.Stream) error {
	if c.Algo == core.AlgoCopyEngine {
		return l.runCopyEngine(c, s)
	}
	be, device := l.h.Backend, l.h.Device
	if launcher, ok := be.(core.CollectiveLauncher); ok {
		c.StopMirror = l.h.StopMirror
		return launcher.LaunchCollective(device, s, c)
	}
	if !be.Capabilities().StreamSignals { // ordinary CPU memory
		mu := &l.h.state().channels[c.Channel]
		mu.Lock()
		defer mu.Unlock()
		return l.runHost(c)
	}
	return core.Errorf(core.ErrUnavailable, "group %q: the backend runs no collectives (it launches no kernels and its memory is not the CPU's)", l.h.GroupName)
}

// argSlot is the address of the argument slot (set, sender) in rank r's
// region (Note [Pad partition] in core).
func (l local) argSlot(r, set, sender int) uintptr {
	words := l.pads[r] + l.h.SignalPadSize + uintptr(4*(core.DeviceRegionHeaderWords+core.DeviceSets*2*l.world))
	return (words+7)&^7 + uintptr(16*(set*l.world+sender))
}

// regionWord is the address of word i of rank r's device region.
func (l local) regionWord(r, i int) *uint32 {
	return (*uint32)(unmanaged.Pointer(l.pads[r] + l.h.SignalPadSize + uintptr(4*i)))
}

// setWord is word i of set's 2*world words in rank r's region.
func (l local) setWord(r, set, i int) *uint32 {
	return l.regionWord(r, core.DeviceRegionHeaderWords+set*2*l.world+i)
}
