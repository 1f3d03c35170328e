package symm

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/libsymmem/libsymmem/core"
)

// Note [Collectives across machines]
//
// On a group whose ranks are on several machines (Note [Local teams]) the
// library carries no byte between machines itself: the group's communicator
// (NCCL) does, through its optional capabilities (core/engine.go).
//
//   - all_gather and reduce_scatter run whole on the communicator
//     (reducer: ncclAllGather / ncclReduceScatter with the call's datatype
//     and op) on the caller's stream, reading this rank's input in the
//     rendezvoused block, which the rendezvous registered as an NCCL
//     symmetric window, so NCCL's symmetric kernels and, where it has them,
//     its network one-sided paths (GIN) run on it. all_reduce runs so too
//     (algo nccl), or hierarchically: a reduce-scatter inside each team
//     with the library's own collectives, NCCL across teams on a
//     communicator split by local rank, an all-gather inside each team
//     (algo hierarchical); auto picks by size and topology (Note
//     [Hierarchical all-reduce] in core/symm/coll, which also says why
//     all_gather and reduce_scatter have no two-level form). The arguments
//     are checked as on one machine; one_shot and two_shot choose among our
//     one-machine kernels and mean nccl here. core/symm/coll runs these
//     (acrossMachines in machines.go), reaching the communicator and the
//     team through the handle's View.
//   - Reduction order and determinism: NCCL's order across machines, not
//     rank order (hierarchical: local rank order inside each team first).
//     For a fixed communicator, algorithm and protocol (NCCL_ALGO/NCCL_PROTO
//     pinned, same topology) NCCL's results repeat run to run; they may
//     differ in the last bits from the one-machine kernels (which reduce in
//     rank order with fp32 accumulation) for float types. int32 sums, max
//     and min are exact, so equal everywhere.
//   - barrier: with NCCL's one-sided API (2.29+, oneSided) a signal to every
//     peer and a wait for one from every peer on the barrier's channel:
//     local peers through the signal pads as on one machine, remote ones
//     through ncclSignal / ncclWaitSignal. Without it, an in-place
//     all-reduce of one int32 on this rank's pad (word 2 of the library's
//     region, Note [Pad partition] in core): a collective returns on no
//     rank before every rank has entered it.
//   - put_signal / wait_signal: to and from a local peer through the pads;
//     to and from a remote one through the one-sided API, slot = channel;
//     with an NCCL older than 2.29 that is SYMMEM_ERROR_UNAVAILABLE naming
//     the version found and the one needed. Each (sender, receiver, channel)
//     is one counting semaphore either way (Note [Signals]). NCCL 2.29 has
//     one signal slot per peer, so across machines only channel 0 carries
//     signals (the communicator refuses others, naming its limit; channels
//     are never folded onto one slot, which would let a wait on one
//     channel consume a signal of another); a barrier on a channel without
//     a slot runs through the all-reduce.
//   - a group made with the caller's all-gather and no communicator maps
//     its local team and nothing else: a collective, a barrier or a remote
//     signal on it is SYMMEM_ERROR_UNAVAILABLE naming the missing engine.
//
// A rank that died on another machine leaves NCCL waiting: the host-side
// wait that follows (a stream or device synchronisation, or the engine's own
// bounded wait) fails with ErrTimeout; the message names the ranks of the
// other machines and their machines.

// span is what the handles of a group that spans machines need to reach
// its remote ranks, made once with the group; nil on a group of one machine.
type span struct {
	// teams is the group's (Note [Local teams]): team is this rank's team
	// (group ranks, ascending), localRank our index in it.
	*teams
	// comm is the group's communicator, nil when it has none; osig its
	// one-sided signals, nil where it has none or the loaded NCCL lacks
	// them (noOneSided says why).
	comm Communicator
	osig oneSided
	// localPeers and remotePeers are the other ranks of this rank's team
	// and of the other teams, each in the order rank+1, rank+2, ... mod
	// world (signalBarrier's).
	localPeers, remotePeers []int
	// uniform: every team has len(team) ranks.
	uniform bool
	// hier is the group's communicator split by local rank (Note
	// [Hierarchical all-reduce] in core/symm/coll).
	hier *hierComm
	// stage lends staging memory to the split-driven all-to-all (the
	// group's commGather; nil without a communicator).
	stage *commGather
}

// newSpan makes g's span once its communicator is known (nil on one
// machine).
func (g *Group) newSpan() *span {
	if g.nteams <= 1 {
		return nil
	}
	s := &span{teams: &g.teams, comm: g.comm, uniform: true, hier: &g.hier, stage: g.cg}
	if osig, ok := g.comm.(oneSided); ok {
		if ok, _ := osig.OneSided(); ok {
			s.osig = osig
		}
	}
	for i := 1; i < g.world; i++ {
		p := (g.rank + i) % g.world
		if g.sameTeam(g.rank, p) {
			s.localPeers = append(s.localPeers, p)
		} else {
			s.remotePeers = append(s.remotePeers, p)
		}
	}
	for _, n := range s.sizes() {
		s.uniform = s.uniform && n == len(g.team)
	}
	return s
}

// sizes is the number of ranks of each team.
func (t *teams) sizes() []int {
	out := make([]int, t.nteams)
	for _, k := range t.teamOf {
		out[k]++
	}
	return out
}

// teamSizes names the teams' sizes: "2, 1".
func (s *span) teamSizes() string {
	var parts []string
	for _, n := range s.sizes() {
		parts = append(parts, fmt.Sprint(n))
	}
	return strings.Join(parts, ", ")
}

// where names rank r and its machine.
func (s *span) where(r int) string {
	return fmt.Sprintf("rank %d on %s", r, s.machines[s.machineOf[r]])
}

// remote names the ranks not in me's team, by machine.
func (s *span) remote(me int) string {
	var parts []string
	for i, m := range s.machines {
		var ranks []int
		for r, k := range s.machineOf {
			if k == i && !s.sameTeam(me, r) {
				ranks = append(ranks, r)
			}
		}
		if len(ranks) == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("rank(s) %s on %s", core.RanksText(ranks), m))
	}
	return strings.Join(parts, "; ")
}

// hierComm is a group's communicator split by local rank, made by the first
// hierarchical all-reduce (Note [Hierarchical all-reduce] in
// core/symm/coll) and destroyed with the group. mu guards the fields; a
// call that uses comm holds mu for reading from before its first NCCL call
// until its last is enqueued, so that close (the group's Destroy, which
// handles may outlive) never destroys it under a call.
type hierComm struct {
	mu     sync.RWMutex
	comm   Communicator
	err    error // why the split failed (kept: a split is collective, it is not retried)
	closed bool
}

// use returns the split communicator, making it on first use (collective:
// ncclCommSplit over the parent), and the function that ends its use.
func (hc *hierComm) use(parent splitter, color, key int) (Communicator, func(), error) {
	hc.mu.Lock()
	if !hc.closed && hc.err == nil && hc.comm == nil {
		c, err := parent.Split(color, key)
		if err == nil && c == nil {
			err = core.Errorf(core.ErrBackend, "the split by local rank %d gave no communicator", color)
		}
		if err != nil {
			hc.err = core.Errorf(core.CodeOf(err), "splitting the communicator by local rank (color %d, key %d): %v", color, key, err)
		}
		hc.comm = c
	}
	hc.mu.Unlock()
	hc.mu.RLock()
	switch {
	case hc.closed:
		hc.mu.RUnlock()
		return nil, nil, core.Errorf(core.ErrInvalidState, "the group is destroyed: its communicator split by local rank is closed")
	case hc.err != nil:
		hc.mu.RUnlock()
		return nil, nil, hc.err
	}
	return hc.comm, hc.mu.RUnlock, nil
}

// close destroys the split communicator, if any, once no call uses it;
// later uses fail.
func (hc *hierComm) close() error {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	hc.closed = true
	c := hc.comm
	hc.comm = nil
	if cl, ok := c.(closer); ok {
		return cl.Close()
	}
	return nil
}

func (hc *hierComm) isClosed() bool {
	hc.mu.RLock()
	defer hc.mu.RUnlock()
	return hc.closed
}

// acrossMachines is what a handle of a group that spans machines does
// through the group's communicator (h.span): signals and barriers with
// remote ranks (Note [Collectives across machines]), and the errors that
// name where those ranks are, which the collectives (core/symm/coll) give
// through View.
type acrossMachines struct{ *Handle }

// noEngine is the error of an operation that needs an engine between
// machines on a group that has none.
func (h acrossMachines) noEngine(what string) error {
	return core.Errorf(core.ErrUnavailable, "group %q: %s needs an engine between machines: the group spans %d machines (this is %s; %s) and was made without a communicator (symmem_group_create_with_allgather); make it over an NCCL communicator (symmem_group_create_nccl)",
		h.name, what, len(h.span.machines), h.span.machines[h.span.machineOf[h.rank]], h.span.remote(h.rank))
}

// engineErr wraps a failure of the communicator with where the other
// ranks are.
func (h acrossMachines) engineErr(what string, err error) error {
	return core.Errorf(core.CodeOf(err), "group %q: rank %d: %s over %s: %v (ranks on other machines: %s)", h.name, h.rank, what, h.span.comm.Describe(), err, h.span.remote(h.rank))
}

// noOneSided says why the group has no one-sided signals (span.osig is
// nil); what names the operation that needs them.
func (h acrossMachines) noOneSided(what string) error {
	if h.span.comm == nil {
		return h.noEngine(what)
	}
	osig, ok := h.span.comm.(oneSided)
	if !ok {
		return core.Errorf(core.ErrUnavailable, "group %q: %s needs NCCL's one-sided signals (NCCL 2.29 or later); %s has none", h.name, what, h.span.comm.Describe())
	}
	_, version := osig.OneSided()
	return core.Errorf(core.ErrUnavailable, "group %q: %s needs NCCL's one-sided signals, from NCCL 2.29; the loaded NCCL is %s", h.name, what, version)
}

// spanPut signals remote rank dst on channel through the communicator.
func (h acrossMachines) spanPut(dst, channel int, s core.Stream) error {
	what := func() string { return "a signal to " + h.span.where(dst) }
	if h.span.osig == nil {
		return h.noOneSided(what())
	}
	if err := h.span.osig.Signal(s, dst, channel); err != nil {
		return h.engineErr(what(), err)
	}
	return nil
}

// spanWait waits for a signal from remote rank src on channel.
func (h acrossMachines) spanWait(src, channel int, s core.Stream) error {
	what := func() string { return "a wait for a signal from " + h.span.where(src) }
	if h.span.osig == nil {
		return h.noOneSided(what())
	}
	if err := h.span.osig.WaitSignal(s, src, channel, 1); err != nil {
		return h.engineErr(what(), err)
	}
	return nil
}

// barrierWord is word 2 of this rank's device region: the buffer of the
// all-reduce that serves as a barrier across machines (its value means
// nothing).
func (h acrossMachines) barrierWord() uintptr { return h.padPtrs[h.rank] + h.padSize + 8 }

// spanBarrier is Barrier on a group that spans machines.
func (h acrossMachines) spanBarrier(channel int, s core.Stream, timeout time.Duration) error {
	if h.span.comm == nil {
		return h.noEngine(barrierText(channel))
	}
	if h.span.osig != nil && h.hasSlot(channel) {
		return h.signalBarrier(channel, s, timeout)
	}
	red, ok := h.span.comm.(reducer)
	if !ok {
		return core.Errorf(core.ErrUnavailable, "group %q: %s across machines needs NCCL's one-sided signals or its typed collectives; %s has neither", h.name, barrierText(channel), h.span.comm.Describe())
	}
	w := h.barrierWord()
	if err := red.AllReduce(s, w, w, 1, core.Int32, core.OpSum); err != nil {
		return h.engineErr(barrierText(channel), err)
	}
	return nil
}

// hasSlot says whether the communicator has a one-sided signal slot for
// channel (when it does not say, every channel is assumed to have one).
func (h acrossMachines) hasSlot(channel int) bool {
	if n, ok := h.span.comm.(signalSlots); ok {
		return channel < n.SignalSlots()
	}
	return true
}

// barrierText names a barrier on channel for messages.
func barrierText(channel int) string { return fmt.Sprintf("a barrier on channel %d", channel) }

// signalBarrier: a signal to every peer, then a wait for every peer; local
// peers through the pads, remote ones through the one-sided signals.
func (h acrossMachines) signalBarrier(channel int, s core.Stream, timeout time.Duration) error {
	osig, local, remote := h.span.osig, h.span.localPeers, h.span.remotePeers
	sp := signalPath{h.Handle}
	for _, p := range remote {
		if err := osig.Signal(s, p, channel); err != nil {
			return h.engineErr(barrierText(channel), err)
		}
	}
	if h.onStreams() {
		if err := sp.streamSignals(s, timeout, channel, local, local); err != nil {
			return err
		}
	} else if err := sp.hostStep(channel, local, local, time.Now().Add(timeout), timeout); err != nil {
		return err
	}
	for _, p := range remote {
		if err := osig.WaitSignal(s, p, channel, 1); err != nil {
			return h.engineErr(barrierText(channel)+" waiting for "+h.span.where(p), err)
		}
	}
	return nil
}
