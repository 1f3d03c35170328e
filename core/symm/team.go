package symm

import (
	"fmt"

	"github.com/libsymmem/libsymmem/core"
)

// Note [Local teams]
//
// A group made over a communicator or the caller's all-gather may hold ranks
// on several machines (Note [Machine identity]). Its ranks split into local
// teams, one per machine: the ranks whose member records name the same
// machine, in rank order. Only inside a team do descriptors travel (the
// group's Unix-socket channel connects the team alone: rank 0 of the team
// listens) and do ranks map each other's buffers and signal pads; a remote
// rank has a NULL buffer and pad pointer in every handle, as nvshmem_ptr and
// ncclGetPeerDevicePointer give NULL for a peer out of reach. Data and
// signals to remote ranks go through the group's communicator (Note
// [Collectives across machines]).
//
// Every rank computes the teams from the same all-gathered records, so
// every rank agrees on them without another exchange. A socket group
// connects every rank through one host's socket and so holds one machine;
// it refuses several, naming them.

// teams is how a group's ranks split over machines. Invariants (checkTeam):
//
//	len(machineOf) == world, every machineOf[r] in [0, len(machines))
//	machines are numbered in order of their lowest rank
//	team == { r : machineOf[r] == machineOf[rank] }, ascending
//	team[localRank] == rank, teamIdx[r] == index of r in team, else -1
type teams struct {
	machineOf []int
	machines  []machineIdentity
	team      []int
	localRank int
	teamIdx   []int
}

// formTeams sets g.teams from g.members, refusing identities that do not
// hold together: two ranks that claim one machine with different boot ids
// (SYMMEM_MACHINE_ID set alike on two real machines) are never one team.
func (g *Group) formTeams() error {
	ms := g.members
	t := teams{machineOf: make([]int, g.world), teamIdx: make([]int, g.world)}
	byKey := map[string]int{}
	for r := range ms {
		id := ms[r].machine()
		i, ok := byKey[id.key()]
		if !ok {
			i = len(t.machines)
			byKey[id.key()] = i
			t.machines = append(t.machines, id)
		}
		t.machineOf[r] = i
	}
	for i, id := range t.machines {
		var ranks []int
		for r := range ms {
			if t.machineOf[r] == i {
				ranks = append(ranks, r)
			}
		}
		if d := byValue(len(ranks), func(k int) string {
			return fmt.Sprintf("host %s (boot id %s)", ms[ranks[k]].hostname, ms[ranks[k]].bootID)
		}); d != "" {
			return core.Errorf(core.ErrMismatch, "group %q: ranks %s claim one machine, %s, but run under different kernels (in the order of those ranks: %s): SYMMEM_MACHINE_ID imitates machines on one host and cannot join two real ones; give each machine its own",
				g.name, ranksText(ranks), id, d)
		}
	}
	mine := t.machineOf[g.rank]
	for r := range ms {
		t.teamIdx[r] = -1
		if t.machineOf[r] == mine {
			t.teamIdx[r] = len(t.team)
			t.team = append(t.team, r)
		}
	}
	t.localRank = t.teamIdx[g.rank]
	g.teams = t
	return g.checkTeam()
}

// checkTeam checks the invariants of g.teams.
func (g *Group) checkTeam() error {
	t := &g.teams
	bad := func(format string, args ...any) error {
		return core.Errorf(core.ErrInternal, "group %q: local team: "+format, append([]any{g.name}, args...)...)
	}
	if len(t.machineOf) != g.world || len(t.teamIdx) != g.world {
		return bad("%d machine entries and %d team indices for %d ranks", len(t.machineOf), len(t.teamIdx), g.world)
	}
	next := 0
	for r, m := range t.machineOf {
		if m < 0 || m >= len(t.machines) || m > next {
			return bad("rank %d is on machine %d of %d (machines are numbered by their lowest rank)", r, m, len(t.machines))
		}
		if m == next {
			next++
		}
	}
	k := 0
	for r := range t.machineOf {
		local := t.machineOf[r] == t.machineOf[g.rank]
		switch {
		case local && (k >= len(t.team) || t.team[k] != r || t.teamIdx[r] != k):
			return bad("rank %d is on this machine but not at index %d of the team %v", r, k, t.team)
		case !local && t.teamIdx[r] != -1:
			return bad("rank %d is on another machine but has team index %d", r, t.teamIdx[r])
		}
		if local {
			k++
		}
	}
	if k != len(t.team) || t.localRank < 0 || t.localRank >= len(t.team) || t.team[t.localRank] != g.rank {
		return bad("team %v, local rank %d, rank %d", t.team, t.localRank, g.rank)
	}
	return nil
}

// isLocal says whether rank r is in this rank's local team.
func (g *Group) isLocal(r int) bool { return g.teamIdx[r] >= 0 }

// LocalRank is this rank's index in its local team, LocalSize the team's
// size (Note [Local teams]).
func (g *Group) LocalRank() int { return g.localRank }
func (g *Group) LocalSize() int { return len(g.team) }

// Machines is the number of machines the group spans.
func (g *Group) Machines() int { return len(g.machines) }

// IsLocal says whether rank r shares this process's machine.
func (g *Group) IsLocal(r int) (bool, error) {
	if r < 0 || r >= g.world {
		return false, core.Errorf(core.ErrInvalidArgument, "group %q: rank %d is out of range [0, %d)", g.name, r, g.world)
	}
	return g.isLocal(r), nil
}

// MachineOf names rank r's machine for messages ("host n2 (boot id ...)").
func (g *Group) MachineOf(r int) (string, error) {
	if r < 0 || r >= g.world {
		return "", core.Errorf(core.ErrInvalidArgument, "group %q: rank %d is out of range [0, %d)", g.name, r, g.world)
	}
	return g.machines[g.machineOf[r]].String(), nil
}

// allToAllFDs passes descriptors inside the local team: out[r] goes to
// rank r (only local ranks may have any), and in[r] came from rank r (nil
// for remote ranks). The channel numbers the team's ranks 0..size-1.
func (g *Group) allToAllFDs(out [][]int) ([][]int, error) {
	lout := make([][]int, len(g.team))
	for r, fds := range out {
		if len(fds) == 0 {
			continue
		}
		if !g.isLocal(r) {
			return nil, core.Errorf(core.ErrInternal, "group %q: descriptors for rank %d, which is on another machine", g.name, r)
		}
		lout[g.teamIdx[r]] = fds
	}
	lin, err := g.ch.AllToAllFDs(0, lout)
	if err != nil {
		return nil, err
	}
	in := make([][]int, g.world)
	for i, fds := range lin {
		in[g.team[i]] = fds
	}
	return in, nil
}
