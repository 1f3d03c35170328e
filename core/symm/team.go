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

// Note [Fabric teams]
//
// Where a rank's device makes memory with fabric handles and the driver
// names its NVLink domain (fabric cluster UUID and clique: Note [Fabric
// handles] in cuda), its member record carries the domain, and ranks of one
// domain form one team even across machines: they map each other as ranks
// of one machine do. Inside such a team, ranks of one machine still pass
// file descriptors over their sockets; between its machines the 64-byte
// fabric handles travel through the group's all-gather (fabricGather), one
// extra all-gather per descriptor exchange, made on every rank whenever
// some team spans machines (a decision every rank takes from the same
// records). Ranks without a domain form teams by machine. A rank with a
// domain and one without on the same machine are in different teams (they
// do not map each other): every GPU of a machine normally reports alike.

// teams is how a group's ranks split over machines and teams, seen from
// this process's rank (self) of the group named groupName; its methods
// answer where a rank is (Group embeds it). Invariants (teams.check):
//
//	len(machineOf) == len(teamOf) == world
//	machines and teams are numbered in order of their lowest rank
//	ranks of one team are on one machine or share a fabric domain
//	team == { r : teamOf[r] == teamOf[rank] }, ascending
//	team[localRank] == rank == self
//	sock == { r in team : machineOf[r] == machineOf[rank] }, ascending,
//	sock[sockRank] == rank (the ranks the group's socket channel connects)
type teams struct {
	groupName string
	self      int
	machineOf []int
	machines  []machineIdentity
	teamOf    []int
	nteams    int
	team      []int
	localRank int
	sock      []int
	sockRank  int
	// fabricSpan: some team spans machines (fabric handles travel).
	fabricSpan bool
}

// formTeams is the teams of the members ms of the group named name, seen
// from rank self of world, refusing identities that do not hold together:
// two ranks that claim one machine with different boot ids
// (SYMMEM_MACHINE_ID set alike on two real machines) are never one team.
func formTeams(name string, self, world int, ms []memberRecord) (teams, error) {
	t := teams{groupName: name, self: self, machineOf: make([]int, world), teamOf: make([]int, world)}
	byKey := map[string]int{}
	teamKey := map[string]int{}
	for r := range ms {
		id := ms[r].machine()
		i, ok := byKey[id.key()]
		if !ok {
			i = len(t.machines)
			byKey[id.key()] = i
			t.machines = append(t.machines, id)
		}
		t.machineOf[r] = i
		key := fmt.Sprintf("machine %d", i)
		if ms[r].fabric != "" {
			key = "fabric " + ms[r].fabric
		}
		k, ok := teamKey[key]
		if !ok {
			k = len(teamKey)
			teamKey[key] = k
		}
		t.teamOf[r] = k
	}
	t.nteams = len(teamKey)
	for i, id := range t.machines {
		var ranks []int
		for r := range ms {
			if t.machineOf[r] == i {
				ranks = append(ranks, r)
			}
		}
		if d := core.RanksByValue(len(ranks), func(k int) string {
			return fmt.Sprintf("host %s (boot id %s)", ms[ranks[k]].hostname, ms[ranks[k]].bootID)
		}); d != "" {
			return teams{}, core.Errorf(core.ErrMismatch, "group %q: ranks %s claim one machine, %s, but run under different kernels (in the order of those ranks: %s): SYMMEM_MACHINE_ID imitates machines on one host and cannot join two real ones; give each machine its own",
				name, core.RanksText(ranks), id, d)
		}
	}
	for r := range ms {
		if t.sameTeam(r, self) {
			if r == self {
				t.localRank = len(t.team)
			}
			t.team = append(t.team, r)
			if t.machineOf[r] == t.machineOf[self] {
				if r == self {
					t.sockRank = len(t.sock)
				}
				t.sock = append(t.sock, r)
			}
		}
		for q := 0; q < r; q++ {
			t.fabricSpan = t.fabricSpan || t.crossTeam(q, r)
		}
	}
	return t, t.check(self, world, ms)
}

// check checks the invariants of t for rank rank of world, whose members
// (when known) say which fabric domain each rank is in.
func (t *teams) check(rank, world int, members []memberRecord) error {
	bad := func(format string, args ...any) error {
		return core.Errorf(core.ErrInternal, "group %q: local team: "+format, append([]any{t.groupName}, args...)...)
	}
	if len(t.machineOf) != world || len(t.teamOf) != world {
		return bad("%d machine entries and %d team entries for %d ranks", len(t.machineOf), len(t.teamOf), world)
	}
	nextM, nextT := 0, 0
	for r := range t.machineOf {
		m, k := t.machineOf[r], t.teamOf[r]
		if m < 0 || m >= len(t.machines) || m > nextM || k < 0 || k >= t.nteams || k > nextT {
			return bad("rank %d is on machine %d of %d and in team %d of %d (both numbered by their lowest rank)", r, m, len(t.machines), k, t.nteams)
		}
		if m == nextM {
			nextM++
		}
		if k == nextT {
			nextT++
		}
		for q := 0; q < r; q++ {
			if t.teamOf[q] == k && t.machineOf[q] != m && (members == nil || members[r].fabric == "" || members[q].fabric != members[r].fabric) {
				return bad("ranks %d and %d are in one team on different machines without a common fabric domain", q, r)
			}
		}
	}
	k, s := 0, 0
	for r := range t.teamOf {
		if t.sameTeam(r, rank) {
			if k >= len(t.team) || t.team[k] != r {
				return bad("rank %d is in this team but not at index %d of the team %v", r, k, t.team)
			}
			k++
			if t.machineOf[r] == t.machineOf[rank] {
				if s >= len(t.sock) || t.sock[s] != r {
					return bad("rank %d is in this team on this machine but not at index %d of the socket team %v", r, s, t.sock)
				}
				s++
			}
		}
	}
	if k != len(t.team) || s != len(t.sock) || t.localRank < 0 || t.localRank >= len(t.team) || t.team[t.localRank] != rank || t.self != rank ||
		t.sockRank < 0 || t.sockRank >= len(t.sock) || t.sock[t.sockRank] != rank {
		return bad("team %v (local rank %d), socket team %v (rank %d), rank %d", t.team, t.localRank, t.sock, t.sockRank, rank)
	}
	return nil
}

// sameTeam says whether ranks a and b are in one team (map each other).
func (t *teams) sameTeam(a, b int) bool { return t.teamOf[a] == t.teamOf[b] }

// isLocal says whether rank r is in this rank's local team (it maps r).
func (t *teams) isLocal(r int) bool { return t.sameTeam(t.self, r) }

// LocalRank is this rank's index in its local team, LocalSize the team's
// size (Note [Local teams]).
func (t *teams) LocalRank() int { return t.localRank }
func (t *teams) LocalSize() int { return len(t.team) }

// fabricBackend is a backend whose memory can carry fabric handles (Note
// [Fabric teams]): cuda's Backend.
type fabricBackend interface {
	FabricDomain(dev int) (domain, why string, err error)
	ExportFabric(m core.Memory) ([]byte, error)
	ImportFabric(dev int, h []byte) (core.Memory, error)
}

// Machines is the number of machines the group spans.
func (t *teams) Machines() int { return len(t.machines) }

// IsLocal says whether rank r shares this process's machine.
func (t *teams) IsLocal(r int) (bool, error) {
	if err := t.checkRank(r); err != nil {
		return false, err
	}
	return t.isLocal(r), nil
}

// MachineOf names rank r's machine for messages ("host n2 (boot id ...)").
func (t *teams) MachineOf(r int) (string, error) {
	if err := t.checkRank(r); err != nil {
		return "", err
	}
	return t.machines[t.machineOf[r]].String(), nil
}

// checkRank refuses a rank outside [0, world).
func (t *teams) checkRank(r int) error {
	if world := len(t.machineOf); r < 0 || r >= world {
		return core.Errorf(core.ErrInvalidArgument, "group %q: rank %d is out of range [0, %d)", t.groupName, r, world)
	}
	return nil
}

// bySocket says whether rank r is reached over this machine's sockets: in
// our team and on our machine.
func (t *teams) bySocket(r int) bool {
	return t.sameTeam(t.self, r) && t.machineOf[r] == t.machineOf[t.self]
}

// crossTeam says whether ranks a and b are in one team on different
// machines: what passes between them are fabric handles.
func (t *teams) crossTeam(a, b int) bool {
	return t.sameTeam(a, b) && t.machineOf[a] != t.machineOf[b]
}
