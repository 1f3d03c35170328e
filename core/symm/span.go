package symm

import (
	"fmt"
	"strings"

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
//     (runAcross in machines.go), reaching the communicator and the team
//     through the handle's description (core.SymmetricBuffer.Span).
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
// its remote ranks, made once with the group; nil on a group of one
// machine.
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
	// across is the span as the handles' descriptions give it to the
	// collectives (core.SymmetricBuffer.Span), and the errors of the
	// engine.
	across core.MachineSpan
	// stage lends staging memory to the split-driven all-to-all (the
	// group's commGather; nil without a communicator).
	stage *commGather
}

// newSpan makes the span of a group whose teams are t, once its
// communicator (comm, nil: none) and the gather over it (cg) are known;
// nil on one machine.
func newSpan(t *teams, comm Communicator, cg *commGather) *span {
	if t.nteams <= 1 {
		return nil
	}
	s := &span{teams: t, comm: comm, stage: cg}
	if osig, ok := comm.(oneSided); ok {
		if ok, _ := osig.OneSided(); ok {
			s.osig = osig
		}
	}
	world := len(t.machineOf)
	for i := 1; i < world; i++ {
		p := (t.self + i) % world
		if t.sameTeam(t.self, p) {
			s.localPeers = append(s.localPeers, p)
		} else {
			s.remotePeers = append(s.remotePeers, p)
		}
	}
	uniform := true
	var sizes []string
	for _, n := range t.sizes() {
		uniform = uniform && n == len(t.team)
		sizes = append(sizes, fmt.Sprint(n))
	}
	s.across = core.MachineSpan{GroupName: t.groupName, Rank: t.self, Team: t.team, LocalRank: t.localRank,
		Uniform: uniform, TeamSizes: strings.Join(sizes, ", "), Machines: len(t.machines),
		Here: t.machines[t.machineOf[t.self]].String(), Remote: s.remote(t.self), Engine: comm}
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

// noOneSided says why the group has no one-sided signals (s.osig is nil);
// what names the operation that needs them.
func (s *span) noOneSided(what string) error {
	if s.comm == nil {
		return s.across.NoEngine(what)
	}
	osig, ok := s.comm.(oneSided)
	if !ok {
		return core.Errorf(core.ErrUnavailable, "group %q: %s needs NCCL's one-sided signals (NCCL 2.29 or later); %s has none", s.across.GroupName, what, s.comm.Describe())
	}
	_, version := osig.OneSided()
	return core.Errorf(core.ErrUnavailable, "group %q: %s needs NCCL's one-sided signals, from NCCL 2.29; the loaded NCCL is %s", s.across.GroupName, what, version)
}

// putRemote signals remote rank dst on channel through the communicator.
func (s *span) putRemote(dst, channel int, stream core.Stream) error {
	what := func() string { return "a signal to " + s.where(dst) }
	if s.osig == nil {
		return s.noOneSided(what())
	}
	if err := s.osig.Signal(stream, dst, channel); err != nil {
		return s.across.EngineErr(what(), err)
	}
	return nil
}

// waitRemote waits for a signal from remote rank src on channel.
func (s *span) waitRemote(src, channel int, stream core.Stream) error {
	what := func() string { return "a wait for a signal from " + s.where(src) }
	if s.osig == nil {
		return s.noOneSided(what())
	}
	if err := s.osig.WaitSignal(stream, src, channel, 1); err != nil {
		return s.across.EngineErr(what(), err)
	}
	return nil
}

// hasSlot says whether the communicator has a one-sided signal slot for
// channel (when it does not say, every channel is assumed to have one).
func (s *span) hasSlot(channel int) bool {
	if n, ok := s.comm.(signalSlots); ok {
		return channel < n.SignalSlots()
	}
	return true
}
