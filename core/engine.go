package core

// Note [Engines]
//
// A group that spans machines, or lives on a communicator the caller owns,
// runs on an engine: today NCCL. core/symm sees the engine only through
// the Communicator interface and the optional capabilities below, found by
// type assertion (docs/design.md: capabilities, not names); cuda's NCCLComm
// implements them on NCCL, and core/symm's tests' communicator on host
// memory. They live here, below both, so that cuda implements them without
// importing core/symm, and Split returns a Communicator that core/symm
// uses as it is.

// Communicator is a collective engine the caller owns (an NCCL communicator).
// The group never destroys it.
type Communicator interface {
	Rank() int
	World() int
	Device() int
	// Describe names it for messages.
	Describe() string
	// AllGather enqueues an all-gather of bytesPerRank bytes per rank from
	// send into recv (device memory) on stream.
	AllGather(stream Stream, send, recv, bytesPerRank uintptr) error
	// RegisterWindow registers [addr, addr+size) as a symmetric window.
	// Collective.
	RegisterWindow(addr, size uintptr) (uintptr, error)
	// DeregisterWindow undoes RegisterWindow. Local.
	DeregisterWindow(win uintptr) error
	// PeerPointer is where peer's window (at offset) is in this process in
	// the communicator's view; ok is false when it cannot say (NCCL < 2.29).
	PeerPointer(win, offset uintptr, peer int) (ptr uintptr, ok bool, err error)
}

// Reducer is a Communicator that runs typed reductions and gathers (NCCL's
// ncclAllReduce / ncclReduceScatter / ncclAllGather with a datatype).
// send/recv are device addresses (host addresses on the host backend),
// enqueued on stream; the call returns when enqueued (NCCL semantics).
// In place is allowed as NCCL allows it (recv == send for all-reduce;
// send == recv + rank*recvCount*size for reduce-scatter;
// send == recv + rank*sendCount*size for all-gather).
type Reducer interface {
	AllReduce(stream Stream, send, recv, count uintptr, dt DType, op ReduceOp) error
	ReduceScatter(stream Stream, send, recv, recvCount uintptr, dt DType, op ReduceOp) error
	AllGatherTyped(stream Stream, send, recv, sendCount uintptr, dt DType) error
}

// Splitter is a Communicator that can be split (ncclCommSplit): ranks with
// the same color form a new communicator, ordered by key. Used for the
// hierarchical collectives (the ranks of equal local rank across machines).
// The returned Communicator belongs to the caller, who destroys it with
// Close (Closer); a rank that joins no child gets (nil, nil), never a
// non-nil interface holding nil.
type Splitter interface {
	Split(color, key int) (Communicator, error)
}

// Closer is a Communicator its holder owns (one it split) and must destroy.
type Closer interface{ Close() error }

// OneSided is NCCL's one-sided signals (NCCL >= 2.29). Signal adds one to
// signal slot `slot` of peer `peer` (slot in [0, SignalSlots())), on stream;
// WaitSignal enqueues on stream a wait until `count` signals from peer have
// arrived in this rank's slot `slot` since the last WaitSignal on it.
// OneSided reports whether the loaded NCCL has the API; when it does not, the
// two calls return ErrUnavailable naming the version found and 2.29 as needed.
type OneSided interface {
	OneSided() (ok bool, version string)
	Signal(stream Stream, peer, slot int) error
	WaitSignal(stream Stream, peer, slot, count int) error
}

// SignalSlotter says how many one-sided signal slots per peer the
// communicator has (NCCL 2.29: one). A barrier on a channel without a slot
// runs through an all-reduce instead; a signal to a remote rank on such a
// channel is refused by the communicator, naming the limit.
type SignalSlotter interface{ SignalSlots() int }

// LSATeam says which peers the communicator can reach by load/store (NCCL's
// LSA team: the ranks of this rank's machine or NVLink domain). ok=false:
// it cannot say (NCCL < 2.29). Used to cross-check a group's own local team.
type LSATeam interface {
	LSAPeers() (peers []int, ok bool, err error)
}

// SendRecver is a Communicator that runs point-to-point transfers (NCCL's
// ncclSend / ncclRecv). SendRecv enqueues ops on stream as one group
// (ncclGroupStart, the ops in order, ncclGroupEnd), so that sends and
// receives between any ranks progress together and none waits for
// another of the same group. Between two ranks, sends and receives match
// in the order each side lists them, and a matched pair must have the
// same size (NCCL's rule); an op of 0 bytes is not posted. Addresses are
// device memory (host memory on the host backend); a rank may send to and
// receive from itself. The call returns when enqueued (NCCL semantics).
type SendRecver interface {
	SendRecv(stream Stream, ops []P2POp) error
}

// P2POp is one transfer of a SendRecv group: Bytes bytes at Addr sent to
// Peer, or with Recv received from Peer into Addr.
type P2POp struct {
	Peer        int
	Addr, Bytes uintptr
	Recv        bool
}
