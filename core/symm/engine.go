package symm

import "github.com/libsymmem/libsymmem/core"

// The optional capabilities of a Communicator, found by type assertion
// (DESIGN.md: capabilities, not names). The cuda package's NCCLComm
// implements them on NCCL; the tests' communicator on host memory. Groups
// that span machines use them for everything that leaves a machine (Note
// [Collectives across machines]).

// reducer: a Communicator that runs typed reductions and gathers (NCCL's
// ncclAllReduce / ncclReduceScatter / ncclAllGather with a datatype).
// send/recv are device addresses (host addresses on the host backend),
// enqueued on stream; the call returns when enqueued (NCCL semantics).
// In place is allowed as NCCL allows it (recv == send for all-reduce;
// send == recv + rank*recvCount*size for reduce-scatter;
// send == recv + rank*sendCount*size for all-gather).
type reducer interface {
	AllReduce(stream core.Stream, send, recv, count uintptr, dt core.DType, op core.ReduceOp) error
	ReduceScatter(stream core.Stream, send, recv, recvCount uintptr, dt core.DType, op core.ReduceOp) error
	AllGatherTyped(stream core.Stream, send, recv, sendCount uintptr, dt core.DType) error
}

// splitter: a Communicator that can be split (ncclCommSplit): ranks with the
// same color form a new communicator, ordered by key. Used for the
// hierarchical collectives (the ranks of equal local rank across machines).
// The returned Communicator is owned by the group: Close destroys it.
type splitter interface {
	Split(color, key int) (Communicator, error)
}

// closer: a Communicator the group owns (one it split) and must destroy.
type closer interface{ Close() error }

// oneSided: NCCL's one-sided signals (NCCL >= 2.29). Signal adds one to
// signal slot `slot` of peer `peer` (slot in [0, SignalSlots())), on stream;
// WaitSignal enqueues on stream a wait until `count` signals from peer have
// arrived in this rank's slot `slot` since the last WaitSignal on it.
// OneSided reports whether the loaded NCCL has the API; when it does not, the
// two calls return core.ErrUnavailable naming the version found and 2.29 as needed.
type oneSided interface {
	OneSided() (ok bool, version string)
	Signal(stream core.Stream, peer, slot int) error
	WaitSignal(stream core.Stream, peer, slot, count int) error
}

// signalSlots: how many one-sided signal slots per peer the communicator
// has (NCCL 2.29: one). A barrier on a channel without a slot runs through
// an all-reduce instead; a signal to a remote rank on such a channel is
// refused by the communicator, naming the limit.
type signalSlots interface{ SignalSlots() int }

// lsaTeam: which peers NCCL can reach by load/store (NCCL's LSA team: the
// ranks of this rank's machine or NVLink domain). ok=false: NCCL cannot say
// (< 2.29). Used to cross-check the group's own local team.
type lsaTeam interface {
	LSAPeers() (peers []int, ok bool, err error)
}
